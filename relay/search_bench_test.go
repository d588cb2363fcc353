package relay

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// BenchmarkSearchLoop measures what the search loop adds to a request,
// without the provider's time (the searcher answers at once) and without the
// model's (the scripted server's time answering is measured and subtracted).
// A web-search request makes two backend calls and one search; a plain
// request to the same server, measured in the same run and alternating with
// it, is the baseline: added = (search − its model time) − (plain − its
// model time).
//
//	go test -run '^$' -bench BenchmarkSearchLoop -benchtime 2000x ./relay/
func BenchmarkSearchLoop(b *testing.B) {
	for _, stream := range []bool{false, true} {
		name := "non-streamed"
		if stream {
			name = "streamed"
		}
		b.Run(name, func(b *testing.B) {
			t := &testing.T{}
			r, sm, _ := searchRelay(t, &fakeSearcher{})
			sm.record = false
			s := "false"
			if stream {
				s = "true"
			}
			plain := `{"model":"m","stream":` + s + `,"messages":[{"role":"user","content":"a question of a few words"}]}`
			searched := `{"model":"m","stream":` + s + `,"messages":[{"role":"user","content":"a question of a few words"}],"web_search_options":{}}`
			run := func(body string) time.Duration {
				req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
				w := httptest.NewRecorder()
				start := time.Now()
				if err := r.ServeChat(w, req, &Call{RequestID: "req_b", Body: []byte(body)}); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			var tPlain, tSearch, mPlain, mSearch time.Duration
			b.ResetTimer()
			for range b.N {
				m0 := sm.busy.Load()
				tPlain += run(plain)
				m1 := sm.busy.Load()
				tSearch += run(searched)
				m2 := sm.busy.Load()
				mPlain += time.Duration(m1 - m0)
				mSearch += time.Duration(m2 - m1)
			}
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N) }
			b.ReportMetric(us(tPlain-mPlain), "plain-us/req")
			b.ReportMetric(us(tSearch-mSearch), "search-us/req")
			b.ReportMetric(us(tSearch-mSearch)-us(tPlain-mPlain), "added-us/req")
		})
	}
}
