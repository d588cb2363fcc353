package operator

import (
	"errors"
	"time"

	"github.com/tollgate/tollgate"
)

// ParseFilter reads a usage filter (account, key, model, backend class,
// since, until); since and until are RFC 3339 times, dates (YYYY-MM-DD,
// UTC) or durations back from now ("24h").
func ParseFilter(account, key, model, backend, since, until string, now time.Time) (tollgate.UsageFilter, error) {
	f := tollgate.UsageFilter{AccountID: account, KeyID: key, Model: model, Class: tollgate.BackendClass(backend)}
	if backend != "" && f.Class != tollgate.ClassNetwork && f.Class != tollgate.ClassFallback {
		return f, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "backend", "backend %q: want network or fallback", backend)
	}
	var err error
	if f.Since, err = parseWhen(since, now); err != nil {
		return f, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "since", "since: %v", err)
	}
	if f.Until, err = parseWhen(until, now); err != nil {
		return f, tollgate.ParamErrorf(tollgate.CodeInvalidRequest, "until", "until: %v", err)
	}
	return f, nil
}

func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, time.DateOnly} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, errors.New("want a time (2026-01-31T00:00:00Z), a date (2026-01-31) or a duration back from now (24h)")
}
