package metrics

import (
	"os"
	"os/exec"
	"testing"
)

// promtool returns the path of Prometheus's promtool for the tests that run
// it. They run when TOLLGATE_TEST_PROMTOOL is set (.ci/run sets it and
// installs Debian's prometheus package): then a missing promtool fails.
// Without the variable (a laptop with Go alone, as the README's test
// command promises) they skip.
func promtool(t *testing.T) (string, bool) {
	t.Helper()
	if os.Getenv("TOLLGATE_TEST_PROMTOOL") == "" {
		return "", false
	}
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("TOLLGATE_TEST_PROMTOOL is set but promtool is not installed (apt-get install prometheus): %v", err)
	}
	return path, true
}
