// Package nodeload reads how loaded a model server is from its own
// Prometheus metrics (vLLM's and SGLang's /metrics), polled off the
// request path, so that every tollgate instance routing to the node sees
// the same load: the node's, not only its own share of it
// (docs/config.md "Routing").
package nodeload

import (
	"bytes"
	"math"
	"strconv"
)

// Report is what a node said about its load.
type Report struct {
	Running int64 // requests in its running batch
	Waiting int64 // requests queued for it
	// KVUsage is the share of its KV cache in use (0..1), -1 when it
	// did not say.
	KVUsage float64
}

// Load is the requests the node holds: running and queued.
func (r Report) Load() int64 { return r.Running + r.Waiting }

// The gauges read, by server. vLLM (vllm/v1/metrics/loggers.py) labels
// them model_name and engine (one series per data-parallel engine);
// SGLang (python/sglang/srt/metrics/collector.py) model_name, engine_type,
// tp_rank, pp_rank and, with data parallelism, dp_rank: every rank of a
// tensor-parallel group reports the same batch.
const (
	gRunning = iota
	gWaiting
	gKV
)

var gauges = map[string]int{
	"vllm:num_requests_running": gRunning,
	"vllm:num_requests_waiting": gWaiting,
	"vllm:kv_cache_usage_perc":  gKV,
	"vllm:gpu_cache_usage_perc": gKV, // its name before vLLM 0.9
	"sglang:num_running_reqs":   gRunning,
	"sglang:num_queue_reqs":     gWaiting,
	"sglang:token_usage":        gKV,
}

// replicaLabels name a series' share of the node: series that differ in
// one of them are different engines and add up; series that differ only
// in other labels (tp_rank, pp_rank) repeat one engine's figure.
var replicaLabels = [][]byte{[]byte("engine"), []byte("dp_rank")}

// Parse reads Prometheus' text exposition format and returns the node's
// load. ok is false when it holds neither a running nor a waiting gauge
// of a known server (not a vLLM or SGLang /metrics, or metrics disabled).
func Parse(text []byte) (r Report, ok bool) {
	type key struct {
		g       int
		replica string
	}
	vals := map[key]float64{}
	seen := [3]bool{}
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = nil
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		// Most lines are other series (histogram buckets): their name
		// alone rules them out, before their labels are scanned.
		end := bytes.IndexAny(line, "{ \t")
		if end <= 0 {
			continue
		}
		g, known := gauges[string(line[:end])]
		if !known {
			continue
		}
		labels, value, good := splitSample(line[end:])
		if !good {
			continue
		}
		v, err := strconv.ParseFloat(string(value), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1e9 {
			continue // not a count a server could hold
		}
		k := key{g, replica(labels)}
		if old, dup := vals[k]; !dup || v > old {
			vals[k] = v
		}
		seen[g] = true
	}
	if !seen[gRunning] && !seen[gWaiting] {
		return Report{KVUsage: -1}, false
	}
	r.KVUsage = -1
	var kvSum float64
	kvN := 0
	for k, v := range vals {
		switch k.g {
		case gRunning:
			r.Running += int64(v + 0.5)
		case gWaiting:
			r.Waiting += int64(v + 0.5)
		case gKV:
			kvSum += v
			kvN++
		}
	}
	if kvN > 0 {
		// vLLM before 0.9 and after both may be present: they are the
		// same figure, so the mean is either.
		r.KVUsage = kvSum / float64(kvN)
	}
	return r, true
}

// splitSample splits what follows a sample's name: `{labels} value
// [timestamp]` or ` value [timestamp]`.
func splitSample(rest []byte) (labels, value []byte, ok bool) {
	if rest[0] == '{' {
		j := closingBrace(rest)
		if j < 0 {
			return nil, nil, false
		}
		labels, rest = rest[1:j], rest[j+1:]
	}
	rest = bytes.TrimLeft(rest, " \t")
	if k := bytes.IndexAny(rest, " \t"); k >= 0 {
		rest = rest[:k] // a timestamp follows
	}
	if len(rest) == 0 {
		return nil, nil, false
	}
	return labels, rest, true
}

// closingBrace finds the '}' ending a label set, skipping quoted values
// (which may hold braces and escaped quotes).
func closingBrace(s []byte) int {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i
		}
	}
	return -1
}

// replica returns the values of a series' replica labels, joined.
func replica(labels []byte) string {
	var out []byte
	for len(labels) > 0 {
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			break
		}
		name := bytes.TrimSpace(bytes.TrimLeft(labels[:eq], ","))
		v := labels[eq+2:]
		end := 0
		for end < len(v) && v[end] != '"' {
			if v[end] == '\\' {
				end++
			}
			end++
		}
		if end > len(v) {
			break
		}
		for _, r := range replicaLabels {
			if bytes.Equal(name, r) {
				out = append(append(append(out, name...), '='), v[:end]...)
				out = append(out, 0)
			}
		}
		if end+1 > len(v) {
			break
		}
		labels = v[end+1:]
	}
	return string(out)
}
