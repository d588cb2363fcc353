// Package browsertest starts headless Chromium for the tests that drive
// web pages in a real browser over the DevTools protocol (chromedp).
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path returns the Chromium to run. The test skips unless
// TOLLGATE_TEST_BROWSER is set; when it is set, a missing Chromium fails
// the test (CI installs it).
func Path(t testing.TB) string {
	t.Helper()
	if os.Getenv("TOLLGATE_TEST_BROWSER") == "" {
		t.Skip("TOLLGATE_TEST_BROWSER is not set")
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("TOLLGATE_TEST_BROWSER is set but no Chromium is installed (apt-get install -y chromium)")
	return ""
}

// Context starts the browser at path (from Path) with opts and returns a
// chromedp context for it, given 90 seconds; the browser ends with the test.
func Context(t testing.TB, path string, opts ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		append([]chromedp.ExecAllocatorOption{chromedp.ExecPath(path), chromedp.NoSandbox}, opts...)...)...)
	ctx, cancelBrowser := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancelBrowser()
		cancelAlloc()
	})
	return ctx
}

// True evaluates the JavaScript expression js on the page of ctx (from
// Context) and reports whether it is true; an error fails the test.
func True(t testing.TB, ctx context.Context, js string) bool {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}
