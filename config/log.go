package config

import "strings"

// Log is the log: section: where tollgate's log lines go and in what form.
// Every request on the api listener is one line at info (docs/operations.md
// lists its fields); warnings and errors are their own lines.
type Log struct {
	// Level is debug, info, warn or error. Default info; `serve
	// --log-level` overrides it.
	Level string `yaml:"level"`
	// Format is json (one object a line, default) or text (key=value).
	Format string `yaml:"format"`
	// Output is stderr (default), stdout, or a file path (relative to the
	// config file), opened for appending.
	Output string `yaml:"output"`
}

func (l *Log) setDefaults() {
	if l.Level == "" {
		l.Level = "info"
	}
	if l.Format == "" {
		l.Format = "json"
	}
	if l.Output == "" {
		l.Output = "stderr"
	}
}

func (l *Log) validate(bad func(key, format string, args ...any)) {
	switch strings.ToLower(l.Level) {
	case "debug", "info", "warn", "error":
	default:
		bad("log.level", "must be debug, info, warn or error, not %q", l.Level)
	}
	switch l.Format {
	case "json", "text":
	default:
		bad("log.format", "must be json or text, not %q", l.Format)
	}
}
