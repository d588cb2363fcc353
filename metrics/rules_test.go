package metrics

import (
	"os/exec"
	"testing"
)

// The alert rules in deploy/prometheus are valid (promtool check rules) and
// fire as their unit tests say (promtool test rules).
func TestAlertRules(t *testing.T) {
	path, ok := promtool(t)
	if !ok {
		t.Skip("TOLLGATE_TEST_PROMTOOL not set (CI sets it and installs promtool)")
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(path, args...)
		cmd.Dir = "../deploy/prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// The compose deployment's Prometheus config is valid and loads the rules.
func TestPrometheusConfig(t *testing.T) {
	path, ok := promtool(t)
	if !ok {
		t.Skip("TOLLGATE_TEST_PROMTOOL not set (CI sets it and installs promtool)")
	}
	cmd := exec.Command(path, "check", "config", "prometheus.yml")
	cmd.Dir = "../deploy/prometheus"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}
