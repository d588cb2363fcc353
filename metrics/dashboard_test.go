package metrics

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The Grafana dashboard's queries are valid PromQL (promtool checks them as
// recording rules, with Grafana's variables filled in) and name only series
// tollgate exports.
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile("../deploy/grafana/tollgate.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	// Every series name tollgate exports (a scrape with one of each).
	m := New(Build{})
	m.Registry.MustRegister(NodeCollector{nodes{{Name: "n", Class: "network"}}}, BillingCollector{bill{}})
	m.ObserveRequest(&Request{Model: "m", Class: "network", Status: 200, Duration: time.Second, TTFT: time.Second})
	m.InflightRequests.Inc()
	m.AuthFailure("invalid_api_key")
	m.Idempotency("replayed")
	exported := scrape(t, m)
	names := regexp.MustCompile(`tollgate_[a-z_]+`)
	fill := strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$model", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			expr := fill.Replace(tg.Expr)
			n++
			q, _ := json.Marshal(expr)
			rules.WriteString("      - record: dashboard:q" + strings.Repeat("x", n) + "\n        expr: " + string(q) + "\n")
			for _, name := range names.FindAllString(expr, -1) {
				if !strings.Contains(exported, "\n"+name+" ") && !strings.Contains(exported, "\n"+name+"{") {
					t.Errorf("panel %q queries %s, which tollgate does not export", p.Title, name)
				}
			}
		}
	}
	if n < 20 {
		t.Fatalf("only %d queries in the dashboard", n)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	pt, ok := promtool(t)
	if !ok {
		t.Log("the queries' PromQL not checked: TOLLGATE_TEST_PROMTOOL is not set")
		return
	}
	if out, err := exec.Command(pt, "check", "rules", path).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}
