package relay

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/syncbuf"
)

// An upstream error's log line says what the backend answered: the status,
// its message (redacted and bounded), the node and the upstream model, so
// that a wrong upstream_model can be fixed from the log alone.
func TestUpstreamErrorLogSaysWhatTheBackendAnswered(t *testing.T) {
	long := strings.Repeat("x", 1000)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"object":"error","message":"The model `+"`qwen3-coder`"+` does not exist. Served at http://10.0.0.5:8000/v1 %s","type":"NotFoundError","param":null,"code":404}`, long)
	}))
	defer up.Close()
	cat := catalog(netModel("m", "qwen3-coder", 1000, 100, 0, NodeSpec{Name: "gpu-a", URL: up.URL + "/v1"}))
	var logged syncbuf.Buffer
	r := New(NewCatalog(cat, nil), Options{}, Deps{Log: slog.New(slog.NewJSONHandler(&logged, nil))})
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	err := r.ServeChat(w, req, &Call{RequestID: "req-1", Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)})
	if tollgate.ErrorCode(err) != tollgate.CodeUpstreamError {
		t.Fatalf("ServeChat: %v, want upstream_error", err)
	}
	var line struct {
		Msg, RequestID, Node, UpstreamModel, UpstreamMessage string
		Status                                               int
	}
	found := false
	for _, l := range strings.Split(logged.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil || m["msg"] != "upstream error" {
			continue
		}
		b, _ := json.Marshal(map[string]any{"Msg": m["msg"], "RequestID": m["request_id"], "Node": m["node"],
			"UpstreamModel": m["upstream_model"], "UpstreamMessage": m["upstream_message"], "Status": m["status"]})
		json.Unmarshal(b, &line)
		found = true
	}
	if !found {
		t.Fatalf("no upstream error line in:\n%s", logged.String())
	}
	if line.RequestID != "req-1" || line.Node != "gpu-a" || line.UpstreamModel != "qwen3-coder" || line.Status != 404 {
		t.Errorf("log line %+v", line)
	}
	if !strings.HasPrefix(line.UpstreamMessage, "The model `qwen3-coder` does not exist. Served at [redacted] xxx") ||
		strings.Contains(line.UpstreamMessage, "10.0.0.5") || len(line.UpstreamMessage) > 303 {
		t.Errorf("upstream_message = %q (%d bytes): want the backend's words, redacted, at most 300 bytes", line.UpstreamMessage, len(line.UpstreamMessage))
	}
}
