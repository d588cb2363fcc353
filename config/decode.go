package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// The decoder below walks the YAML node tree beside the Config struct
// instead of handing the document to yaml.v3's Decode: Decode stops at the
// first value a custom unmarshaler refuses and says neither the key path
// nor, for unknown keys, what was meant. Walking the nodes, every problem
// is collected with its key path and line, an unknown key suggests the
// nearest valid one, and validation still runs on everything that parsed,
// so one bad value never hides another.

// problem is one thing wrong with the file.
type problem struct {
	line int // 0: no line (a required key that is absent from the file)
	key  string
	msg  string
}

func (p problem) Error() string {
	if p.line > 0 {
		return fmt.Sprintf("line %d: %s: %s", p.line, p.key, p.msg)
	}
	return fmt.Sprintf("%s: %s", p.key, p.msg)
}

// decoder fills a Config from a node tree, collecting problems.
type decoder struct {
	problems []problem
	lines    map[string]int  // key path → line of its key (or item)
	failed   map[string]bool // key paths whose value did not parse
}

// decodeDocument decodes b into c. It returns the problems found while
// decoding and the line of every key path, for validation's messages.
func decodeDocument(b []byte, c *Config) (*decoder, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		// A syntax error: yaml.v3's message already carries the line.
		return nil, fmt.Errorf("parse: %w", err)
	}
	d := &decoder{lines: map[string]int{}, failed: map[string]bool{}}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return d, nil
		}
		root = root.Content[0]
	}
	if root.Kind == 0 || isNull(root) {
		return d, nil
	}
	d.value(root, reflect.ValueOf(c).Elem(), "")
	return d, nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

var unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()

// value decodes n into v, whose key path is path.
func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if isNull(n) {
		return // an empty value keeps the default
	}
	if v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct && !v.Type().Implements(unmarshalerType) {
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		v = v.Elem()
	}
	switch {
	case v.Kind() == reflect.Struct && !reflect.PointerTo(v.Type()).Implements(unmarshalerType):
		if n.Kind != yaml.MappingNode {
			d.fail(n, path, "want a mapping of keys (key: value)")
			return
		}
		d.mapping(n, v, path)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct:
		if n.Kind != yaml.SequenceNode {
			d.fail(n, path, "want a list (- item)")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			d.lines[p] = item.Line
			d.value(item, s.Index(i), p)
		}
		v.Set(s)
	default:
		// A leaf: yaml.v3 decodes it, into a fresh value so that a bad
		// one leaves the field at its zero (its default).
		fresh := reflect.New(v.Type())
		if err := n.Decode(fresh.Interface()); err != nil {
			d.fail(n, path, leafMessage(err, n, v.Type()))
			return
		}
		v.Set(fresh.Elem())
	}
}

// mapping decodes a mapping node into the struct v.
func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	fields := yamlFields(v.Type())
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Value == "<<" && k.Tag == "!!merge" {
			src := val
			if src.Kind == yaml.AliasNode && src.Alias != nil {
				src = src.Alias
			}
			if src.Kind == yaml.MappingNode {
				d.mapping(src, v, path)
				continue
			}
		}
		p := join(path, k.Value)
		if first, ok := seen[k.Value]; ok {
			d.problems = append(d.problems, problem{k.Line, p, fmt.Sprintf("key given twice (first on line %d)", first)})
			continue
		}
		seen[k.Value] = k.Line
		idx, ok := fields[k.Value]
		if !ok {
			d.problems = append(d.problems, problem{k.Line, p, unknownKey(k.Value, fields)})
			continue
		}
		d.lines[p] = k.Line
		d.value(val, v.Field(idx), p)
	}
}

func (d *decoder) fail(n *yaml.Node, path, msg string) {
	d.failed[path] = true
	d.problems = append(d.problems, problem{n.Line, path, msg})
}

// leafMessage says why a scalar did not decode, in words.
func leafMessage(err error, n *yaml.Node, t reflect.Type) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		switch t.Kind() {
		case reflect.Int, reflect.Int64, reflect.Int32:
			return fmt.Sprintf("%q is not a whole number", n.Value)
		case reflect.Bool:
			return fmt.Sprintf("%q is not true or false", n.Value)
		case reflect.Float64, reflect.Float32:
			return fmt.Sprintf("%q is not a number", n.Value)
		case reflect.String:
			return "want a single value, not a list or mapping"
		case reflect.Slice:
			return "want a list such as [a, b]"
		}
	}
	return err.Error()
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// yamlFields maps a struct's yaml keys to field indexes (fields tagged "-"
// are not keys).
func yamlFields(t reflect.Type) map[string]int {
	m := map[string]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		m[name] = i
	}
	return m
}

// unknownKey says a key is unknown, suggesting the nearest valid key at the
// same level: within an edit distance of 2, or sharing a prefix of at
// least 4 characters.
func unknownKey(key string, fields map[string]int) string {
	best, bestScore := "", 1<<30
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names) // ties go to the first name, every run alike
	for _, name := range names {
		dist := editDistance(key, name)
		score := dist
		if dist > 2 {
			p := commonPrefix(key, name)
			if p < 4 {
				continue
			}
			score = 3 + len(key) - p // the longer the shared prefix the better; below any near spelling
		}
		if score < bestScore {
			best, bestScore = name, score
		}
	}
	if best == "" {
		return fmt.Sprintf("unknown key (valid here: %s)", strings.Join(names, ", "))
	}
	return fmt.Sprintf("unknown key (did you mean %s?)", best)
}

func commonPrefix(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of adjacent letters.
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// idLabel matches the " (id)" that validation adds after models[i].
var idLabel = regexp.MustCompile(` \([^)]*\)`)

// line finds the line of a key path as validation writes it: the key's own
// line, else its nearest ancestor's that is in the file (a required key
// that is missing is reported at the mapping that lacks it).
func (d *decoder) line(key string) int {
	p := idLabel.ReplaceAllString(key, "")
	for p != "" {
		if l, ok := d.lines[p]; ok {
			return l
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0
}

// problems is every problem of a file, one a line.
type problems []problem

func (ps problems) Error() string {
	if len(ps) == 1 {
		return ps[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d problems:", len(ps))
	for _, p := range ps {
		b.WriteString("\n  ")
		b.WriteString(p.Error())
	}
	return b.String()
}

func (ps problems) Unwrap() []error {
	errs := make([]error, len(ps))
	for i, p := range ps {
		errs[i] = p
	}
	return errs
}

// joinProblems orders problems by line (those without one last) and joins them.
func joinProblems(ps []problem) error {
	if len(ps) == 0 {
		return nil
	}
	sort.SliceStable(ps, func(i, j int) bool {
		li, lj := ps[i].line, ps[j].line
		if li == 0 || lj == 0 {
			return li != 0 && lj == 0
		}
		return li < lj
	})
	return problems(ps)
}
