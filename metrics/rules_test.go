package metrics

import (
	"os/exec"
	"testing"
)

// The alert rules in deploy/prometheus are valid (promtool check rules) and
// fire as their unit tests say (promtool test rules). A missing promtool
// fails, it does not skip.
func TestAlertRules(t *testing.T) {
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (apt-get install prometheus): %v", err)
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
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (apt-get install prometheus): %v", err)
	}
	cmd := exec.Command(path, "check", "config", "prometheus.yml")
	cmd.Dir = "../deploy/prometheus"
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
}
