package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
)

// testAuditRuns: no run is ErrNotFound; a run comes back exactly (amounts,
// the time to the microsecond, its problems, how long it took); a run keeps
// its first AuditProblemsKept problems and their count; the newest by time
// is returned, even when an older one was recorded after it.
func testAuditRuns(t *testing.T, s BillingStore) {
	if _, err := s.LastAudit(ctx(t)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Fatalf("LastAudit of an empty store: %v, want ErrNotFound", err)
	}
	first := tollgate.AuditRun{Time: t0.Truncate(time.Microsecond), Source: tollgate.AuditFromCLI, OK: true, Accounts: 3, Keys: 5,
		Balance: tollgate.MustParseAmount("1234567.000000000001"), Held: tollgate.MustParseAmount("0.000000000007"),
		Took: 1234567 * time.Microsecond}
	if err := s.RecordAudit(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	got, err := s.LastAudit(ctx(t))
	if err != nil || !sameRun(got, first) {
		t.Fatalf("LastAudit: %+v, %v; want %+v", got, err, first)
	}

	problems := make([]string, tollgate.AuditProblemsKept+7)
	for i := range problems {
		problems[i] = fmt.Sprintf("account acct_%d: balance 1 is below zero — «%d»", i, i)
	}
	bad := tollgate.AuditRun{Time: t0.Add(time.Hour).Truncate(time.Microsecond), Source: tollgate.AuditFromAdminAPI, Accounts: 1,
		Balance: -tollgate.MustParseAmount("0.5"), Problems: problems, ProblemCount: int64(len(problems)), Took: time.Microsecond}
	if err := s.RecordAudit(ctx(t), bad); err != nil {
		t.Fatal(err)
	}
	want := bad
	want.Problems = problems[:tollgate.AuditProblemsKept]
	if got, err := s.LastAudit(ctx(t)); err != nil || !sameRun(got, want) {
		t.Fatalf("LastAudit with %d problems: %+v, %v; want the first %d (%+v)", len(problems), got, err, tollgate.AuditProblemsKept, want)
	}

	// A run that started before the newest but was recorded after it.
	late := first
	late.Time, late.Source = t0.Add(30*time.Minute).Truncate(time.Microsecond), tollgate.AuditFromConsole
	if err := s.RecordAudit(ctx(t), late); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LastAudit(ctx(t)); err != nil || !sameRun(got, want) {
		t.Errorf("LastAudit after an older run: %+v, %v; want the newest, %+v", got, err, want)
	}
	later := late
	later.Time = want.Time.Add(time.Microsecond)
	if err := s.RecordAudit(ctx(t), later); err != nil {
		t.Fatal(err)
	}
	if got, err := s.LastAudit(ctx(t)); err != nil || !sameRun(got, later) {
		t.Errorf("LastAudit a microsecond later: %+v, %v; want %+v", got, err, later)
	}
}

// sameRun compares runs field by field (times by Equal).
func sameRun(a, b tollgate.AuditRun) bool {
	return a.Time.Equal(b.Time) && a.Source == b.Source && a.OK == b.OK && a.Accounts == b.Accounts && a.Keys == b.Keys &&
		a.Balance == b.Balance && a.Held == b.Held && slices.Equal(a.Problems, b.Problems) && a.ProblemCount == b.ProblemCount && a.Took == b.Took
}

// AuditRunsBounded checks that recording runs, one after another and
// concurrently, leaves the newest tollgate.AuditRunsKept of them: rows
// counts the store's audit_runs rows (which the interface does not show).
func AuditRunsBounded(t *testing.T, s BillingStore, rows func() (int, error)) {
	record := func(i int) error {
		return s.RecordAudit(ctx(t), tollgate.AuditRun{Time: t0.Add(time.Duration(i) * time.Second), Source: tollgate.AuditFromCLI, OK: true, Accounts: int64(i)})
	}
	for i := range tollgate.AuditRunsKept + 20 {
		if err := record(i); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := rows(); err != nil || n != tollgate.AuditRunsKept {
		t.Fatalf("%d rows after %d runs (%v), want %d", n, tollgate.AuditRunsKept+20, err, tollgate.AuditRunsKept)
	}
	const writers = 8
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() { errs <- record(1000 + w) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n, err := rows(); err != nil || n != tollgate.AuditRunsKept {
		t.Errorf("%d rows after %d concurrent runs (%v), want %d", n, writers, err, tollgate.AuditRunsKept)
	}
	if got, err := s.LastAudit(ctx(t)); err != nil || got.Accounts != 1000+writers-1 {
		t.Errorf("LastAudit: %+v, %v; want the run of account count %d (the newest)", got, err, 1000+writers-1)
	}
}
