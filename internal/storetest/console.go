package storetest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/operator"
)

// runConsole runs the console's store tests (tollgate.ConsoleStore).
func runConsole(t *testing.T, open func(t *testing.T) Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s BillingStore, c tollgate.ConsoleStore)
	}{
		{"Invite", testConsoleInvite},
		{"Sessions", testConsoleSessions},
		{"KeyUsageAndRecent", testConsoleKeyUsage},
		{"InviteEndsSessions", testConsoleInviteEndsSessions},
		{"SavedDays", testConsoleSavedDays},
		{"SaveDaysConcurrent", testConsoleSaveDaysConcurrent},
		{"Secret", testConsoleSecret},
		{"OperatorEntries", testConsoleOperatorEntries},
	}
	for _, tc := range tests {
		t.Run("Console"+tc.name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			tc.fn(t, s, s)
		})
	}
}

func testConsoleInvite(t *testing.T, s BillingStore, c tollgate.ConsoleStore) {
	a, _ := fundedKey(t, s, usd("1"), nil)
	tok := tollgate.HashKey(tollgate.NewKeySecret())
	if err := c.CreateInvite(ctx(t), tok, tollgate.ConsoleInvite{AccountID: "acct_nope", Created: t0, Expires: t0.Add(time.Hour)}); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("invite for a missing account: %v, want ErrNotFound", err)
	}
	if _, err := c.PasswordHash(ctx(t), a.ID); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("password before any: %v, want ErrNotFound", err)
	}
	if err := c.CreateInvite(ctx(t), tok, tollgate.ConsoleInvite{AccountID: a.ID, Created: t0, Expires: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AcceptInvite(ctx(t), tok, "h1", t0.Add(time.Hour)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("accept at expiry: %v, want ErrNotFound", err)
	}
	if inv, err := c.Invite(ctx(t), tok); err != nil || inv.AccountID != a.ID || !inv.Created.Equal(t0.Truncate(time.Microsecond)) ||
		!inv.Expires.Equal(t0.Add(time.Hour).Truncate(time.Microsecond)) || !inv.Used.IsZero() {
		t.Errorf("invite before use = %+v, %v", inv, err)
	}
	got, err := c.AcceptInvite(ctx(t), tok, "h1", t0.Add(time.Minute))
	if err != nil || got != a.ID {
		t.Fatalf("accept = %q, %v; want %s", got, err, a.ID)
	}
	if inv, err := c.Invite(ctx(t), tok); err != nil || !inv.Used.Equal(t0.Add(time.Minute).Truncate(time.Microsecond)) {
		t.Errorf("invite after use = %+v, %v; want used at %s", inv, err, t0.Add(time.Minute))
	}
	if _, err := c.Invite(ctx(t), tollgate.HashKey(tollgate.NewKeySecret())); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("an invitation never made: %v, want ErrNotFound", err)
	}
	if _, err := c.AcceptInvite(ctx(t), tok, "h2", t0.Add(2*time.Minute)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("second accept: %v, want ErrNotFound", err)
	}
	if h, err := c.PasswordHash(ctx(t), a.ID); err != nil || h != "h1" {
		t.Errorf("password = %q, %v; want h1", h, err)
	}
	// A second invitation replaces the password.
	tok2 := tollgate.HashKey(tollgate.NewKeySecret())
	if err := c.CreateInvite(ctx(t), tok2, tollgate.ConsoleInvite{AccountID: a.ID, Created: t0, Expires: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AcceptInvite(ctx(t), tok2, "h3", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if h, _ := c.PasswordHash(ctx(t), a.ID); h != "h3" {
		t.Errorf("password after a second invitation = %q, want h3", h)
	}
}

// A password set through an invitation ends the account's sessions (a
// reset must lock out whoever held one) and revokes their playground keys,
// and tells the auth caches (AuthVersion); other accounts' sessions stay.
func testConsoleInviteEndsSessions(t *testing.T, s BillingStore, c tollgate.ConsoleStore) {
	ks := s
	a, play := fundedKey(t, s, usd("1"), nil)
	own := tollgate.Key{ID: tollgate.NewID("key_"), AccountID: a.ID, Name: "own", Created: t0}
	if err := ks.CreateKey(ctx(t), own, tollgate.HashKey(tollgate.NewKeySecret())); err != nil {
		t.Fatal(err)
	}
	b, _ := fundedKey(t, s, usd("1"), nil)
	withKey, plain, others := tollgate.HashKey(tollgate.NewKeySecret()), tollgate.HashKey(tollgate.NewKeySecret()), tollgate.HashKey(tollgate.NewKeySecret())
	for h, acct := range map[tollgate.KeyHash]string{withKey: a.ID, plain: a.ID, others: b.ID} {
		if err := c.CreateSession(ctx(t), h, tollgate.ConsoleSession{AccountID: acct, Created: t0, Expires: t0.Add(24 * time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SetSessionKey(ctx(t), withKey, play.ID); err != nil {
		t.Fatal(err)
	}
	v0, err := ks.AuthVersion(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	tok := tollgate.HashKey(tollgate.NewKeySecret())
	if err := c.CreateInvite(ctx(t), tok, tollgate.ConsoleInvite{AccountID: a.ID, Created: t0, Expires: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Minute).Truncate(time.Microsecond)
	if _, err := c.AcceptInvite(ctx(t), tok, "h", now); err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]tollgate.KeyHash{"with a playground key": withKey, "without": plain} {
		if _, err := c.Session(ctx(t), h, now); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("the account's session %s after a new password: %v, want ErrNotFound", name, err)
		}
	}
	if _, err := c.Session(ctx(t), others, now); err != nil {
		t.Errorf("another account's session: %v", err)
	}
	keys, err := ks.Keys(ctx(t), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		switch {
		case k.ID == play.ID && !k.Revoked.Equal(now):
			t.Errorf("the session's playground key: revoked %v, want %v", k.Revoked, now)
		case k.ID == own.ID && !k.Revoked.IsZero():
			t.Errorf("the holder's own key was revoked (%v)", k.Revoked)
		}
	}
	if v1, _ := ks.AuthVersion(ctx(t)); v1 <= v0 {
		t.Errorf("AuthVersion %d -> %d: the revoked key would stay in the auth caches", v0, v1)
	}
}

func testConsoleSessions(t *testing.T, s BillingStore, c tollgate.ConsoleStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	old, cur := tollgate.HashKey(tollgate.NewKeySecret()), tollgate.HashKey(tollgate.NewKeySecret())
	if err := c.CreateSession(ctx(t), old, tollgate.ConsoleSession{AccountID: a.ID, Created: t0, Expires: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Session(ctx(t), old, t0.Add(time.Hour)); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("session at expiry: %v, want ErrNotFound", err)
	}
	later := t0.Add(2 * time.Hour)
	if err := c.CreateSession(ctx(t), cur, tollgate.ConsoleSession{AccountID: a.ID, Created: later, Expires: later.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	// Creating the new session deleted the expired one.
	if _, err := c.DeleteSession(ctx(t), old); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("expired session still stored: %v", err)
	}
	got, err := c.Session(ctx(t), cur, later)
	if err != nil || got.AccountID != a.ID || !got.Created.Equal(later.Truncate(time.Microsecond)) || got.PlaygroundKey != "" {
		t.Fatalf("session = %+v, %v", got, err)
	}
	if prev, err := c.SetSessionKey(ctx(t), cur, "key_first"); err != nil || prev != "" {
		t.Fatalf("first set key = %q, %v; want no previous key", prev, err)
	}
	if prev, err := c.SetSessionKey(ctx(t), cur, k.ID); err != nil || prev != "key_first" {
		t.Fatalf("second set key = %q, %v; want the first key back", prev, err)
	}
	// Setters at once: each gets back a different previous key, so that
	// every key but the last is revoked by exactly one of them.
	const setters = 8
	prevs := make(chan string, setters)
	var wg sync.WaitGroup
	for i := range setters {
		wg.Go(func() {
			prev, err := c.SetSessionKey(ctx(t), cur, fmt.Sprintf("key_%d", i))
			if err != nil {
				t.Error(err)
			}
			prevs <- prev
		})
	}
	wg.Wait()
	close(prevs)
	final, err := c.Session(ctx(t), cur, later)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for p := range prevs {
		seen[p]++
	}
	want := map[string]int{k.ID: 1}
	for i := range setters {
		if key := fmt.Sprintf("key_%d", i); key != final.PlaygroundKey {
			want[key] = 1
		}
	}
	if !maps.Equal(seen, want) {
		t.Errorf("previous keys of concurrent setters %v, want each replaced key once %v (final %s)", seen, want, final.PlaygroundKey)
	}
	if _, err := c.SetSessionKey(ctx(t), cur, k.ID); err != nil {
		t.Fatal(err)
	}
	got, err = c.DeleteSession(ctx(t), cur)
	if err != nil || got.PlaygroundKey != k.ID {
		t.Errorf("deleted session = %+v, %v; want playground key %s", got, err, k.ID)
	}
	if _, err := c.Session(ctx(t), cur, later); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("session after delete: %v", err)
	}
	if _, err := c.SetSessionKey(ctx(t), cur, k.ID); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("set key of a deleted session: %v", err)
	}
}

func testConsoleKeyUsage(t *testing.T, s BillingStore, c tollgate.ConsoleStore) {
	a, k1 := fundedKey(t, s, usd("10"), nil)
	k2, _ := newKey(t, s, a.ID, nil)
	var last time.Time
	for i, k := range []tollgate.Key{k1, k1, k2} {
		last = t0.Add(time.Duration(i) * time.Minute)
		h := holdOp(a, k, usd("0.5"), last)
		apply(t, s, h, settleOp(h, usd("0.000000000007"), last))
	}
	us, err := c.KeyUsage(ctx(t), a.ID)
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]tollgate.KeyUsage{}
	for _, u := range us {
		byKey[u.KeyID] = u
	}
	if u := byKey[k1.ID]; u.Requests != 2 || u.Spent != usd("0.000000000014") || !u.LastUsed.Equal(t0.Add(time.Minute).Truncate(time.Microsecond)) {
		t.Errorf("usage of k1 = %+v", u)
	}
	if u := byKey[k2.ID]; u.Requests != 1 || u.Spent != usd("0.000000000007") {
		t.Errorf("usage of k2 = %+v", u)
	}
	es, err := c.RecentCharges(ctx(t), tollgate.UsageFilter{AccountID: a.ID}, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].Charge == nil || es[0].Charge.KeyID != k2.ID || !es[0].Time.Equal(last.Truncate(time.Microsecond)) || es[1].Charge.KeyID != k1.ID {
		t.Fatalf("recent = %+v, want k2's then k1's newest", es)
	}
	es, err = c.RecentCharges(ctx(t), tollgate.UsageFilter{AccountID: a.ID, KeyID: k1.ID}, 1, 10)
	if err != nil || len(es) != 1 || !es[0].Time.Equal(t0.Truncate(time.Microsecond)) {
		t.Errorf("recent of k1 from the second = %+v, %v; want k1's first charge", es, err)
	}
	days, err := c.DailyCharges(ctx(t), tollgate.UsageFilter{AccountID: a.ID})
	if err != nil {
		t.Fatal(err)
	}
	want := tollgate.ChargeDay{Day: t0.Truncate(24 * time.Hour), KeyID: k1.ID, Model: "m", Class: tollgate.ClassNetwork, Requests: 2,
		PromptTokens: 200, CompletionTokens: 40, CachedTokens: 14, ReasoningTokens: 10, Estimated: 2, Cost: usd("0.000000000014")}
	if len(days) != 2 || (days[0] != want && days[1] != want) {
		t.Errorf("daily charges = %+v, want among them %+v", days, want)
	}
	if days, err := c.DailyCharges(ctx(t), tollgate.UsageFilter{AccountID: a.ID, Since: t0.Add(2 * time.Minute)}); err != nil || len(days) != 1 || days[0].KeyID != k2.ID {
		t.Errorf("daily charges since the last = %+v, %v", days, err)
	}
	es, err = c.RecentCharges(ctx(t), tollgate.UsageFilter{AccountID: a.ID, Model: "other"}, 0, 10)
	if err != nil || len(es) != 0 {
		t.Errorf("recent of another model = %+v, %v", es, err)
	}

	// Day marks: a row added to a past day (a recovered charge) changes that
	// day's mark, and only that day's; another account's rows change none.
	day := t0.Truncate(24 * time.Hour)
	marks := func() []tollgate.DayMark {
		t.Helper()
		ms, err := c.DayMarks(ctx(t), a.ID, day.AddDate(0, 0, -1), day.AddDate(0, 0, 2))
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	h := holdOp(a, k1, usd("0.5"), t0.AddDate(0, 0, 1))
	apply(t, s, h, settleOp(h, usd("0.000000000007"), t0.AddDate(0, 0, 1)))
	before := marks()
	if len(before) < 2 || !before[len(before)-1].Day.Equal(day.AddDate(0, 0, 1)) || before[len(before)-1].Rows != 1 {
		t.Fatalf("day marks = %+v, want the next day's one row last", before)
	}
	b, _ := fundedKey(t, s, usd("10"), nil)
	bk, _ := newKey(t, s, b.ID, nil)
	hb := holdOp(b, bk, usd("0.5"), t0)
	apply(t, s, hb, settleOp(hb, usd("0.000000000007"), t0))
	if after := marks(); !slices.Equal(after, before) {
		t.Errorf("another account's charge changed the marks: %+v, were %+v", after, before)
	}
	h = holdOp(a, k1, usd("0.5"), t0.Add(30*time.Second))
	apply(t, s, h, settleOp(h, usd("0.000000000007"), t0.Add(30*time.Second)))
	span, err := c.SpanMark(ctx(t), a.ID, day.AddDate(0, 0, -1), day.AddDate(0, 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	after := marks()
	if want := (tollgate.DayMark{Day: day.AddDate(0, 0, -1), Rows: after[0].Rows + after[1].Rows, LastSeq: max(after[0].LastSeq, after[1].LastSeq)}); len(after) != 2 || span != want {
		t.Errorf("span mark = %+v, want %+v (from the day marks %+v)", span, want, after)
	}
	if empty, err := c.SpanMark(ctx(t), a.ID, day.AddDate(0, 0, 5), day.AddDate(0, 0, 6)); err != nil || empty.Rows != 0 || empty.LastSeq != 0 {
		t.Errorf("span mark of an empty span = %+v, %v", empty, err)
	}
	i := slices.IndexFunc(after, func(m tollgate.DayMark) bool { return m.Day.Equal(day) })
	j := slices.IndexFunc(before, func(m tollgate.DayMark) bool { return m.Day.Equal(day) })
	if i < 0 || j < 0 || after[i].Rows != before[j].Rows+1 || after[i].LastSeq <= before[len(before)-1].LastSeq {
		t.Errorf("a charge into a past day: marks %+v, were %+v", after, before)
	}
	if after[len(after)-1] != before[len(before)-1] {
		t.Errorf("a charge into a past day changed the next day's mark: %+v, was %+v", after[len(after)-1], before[len(before)-1])
	}
}

// savedDay reads one day of the account's saved days (ok false if it has
// none).
func savedDay(t *testing.T, c tollgate.ConsoleStore, acct string, day time.Time) (tollgate.SavedDay, bool) {
	t.Helper()
	ds, err := c.SavedDays(ctx(t), acct, day, day.AddDate(0, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) > 1 {
		t.Fatalf("saved days of one day: %+v", ds)
	}
	if len(ds) == 0 {
		return tollgate.SavedDay{}, false
	}
	return ds[0], true
}

// The console's saved days give back what the ledger's marks and sums were
// (times equal as ==, as the console compares marks), a day with a mark and
// no sums, and only the account's days in the span; a save replaces a day
// whole and deletes the days before its since.
func testConsoleSavedDays(t *testing.T, s BillingStore, c tollgate.ConsoleStore) {
	a, k1 := fundedKey(t, s, usd("10"), nil)
	k2, _ := newKey(t, s, a.ID, nil)
	day := t0.Truncate(24 * time.Hour)
	if err := c.SaveDays(ctx(t), "acct_nope", day, []tollgate.SavedDay{{Mark: tollgate.DayMark{Day: day, Rows: 1, LastSeq: 1}}}); !errors.Is(err, tollgate.ErrNotFound) {
		t.Errorf("save days of a missing account: %v, want ErrNotFound", err)
	}
	for i, k := range []tollgate.Key{k1, k2, k1} {
		at := t0.Add(time.Duration(i) * time.Minute)
		h := holdOp(a, k, usd("0.5"), at)
		apply(t, s, h, settleOp(h, usd("0.000000000007"), at))
	}
	h := holdOp(a, k2, usd("0.5"), t0.AddDate(0, 0, 2))
	apply(t, s, h, settleOp(h, usd("1.000000000001"), t0.AddDate(0, 0, 2)))
	// The day between has a credit only.
	if _, err := operator.Post(ctx(t), s, tollgate.LedgerCredit, a.ID, usd("3"), "top-up", "storetest", t0.AddDate(0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	since, until := day.AddDate(0, 0, -1), day.AddDate(0, 0, 3)
	marks, err := c.DayMarks(ctx(t), a.ID, since, until)
	if err != nil {
		t.Fatal(err)
	}
	sums, err := c.DailyCharges(ctx(t), tollgate.UsageFilter{AccountID: a.ID, Since: since, Until: until})
	if err != nil {
		t.Fatal(err)
	}
	var want []tollgate.SavedDay
	for _, m := range marks {
		d := tollgate.SavedDay{Mark: m}
		for _, cd := range sums {
			if cd.Day == m.Day {
				d.Sums = append(d.Sums, cd)
			}
		}
		want = append(want, d)
	}
	if len(want) != 3 || !want[0].Mark.Day.Equal(day) || len(want[len(want)-2].Sums) != 0 || len(want[len(want)-1].Sums) != 1 {
		t.Fatalf("the ledger's days = %+v, want the credit's day without sums and the last day with one", want)
	}
	if ds, err := c.SavedDays(ctx(t), a.ID, since, until); err != nil || len(ds) != 0 {
		t.Errorf("saved days before any save = %+v, %v", ds, err)
	}
	if err := c.SaveDays(ctx(t), a.ID, since, want); err != nil {
		t.Fatal(err)
	}
	b, _ := fundedKey(t, s, usd("1"), nil)
	other := []tollgate.SavedDay{{Mark: tollgate.DayMark{Day: day, Rows: 9, LastSeq: 99}, Sums: []tollgate.ChargeDay{{Day: day, KeyID: "key_b", Model: "m", Requests: 9}}}}
	if err := c.SaveDays(ctx(t), b.ID, day, other); err != nil {
		t.Fatal(err)
	}
	got, err := c.SavedDays(ctx(t), a.ID, since, until)
	if err != nil {
		t.Fatal(err)
	}
	if !equalDays(got, want) {
		t.Fatalf("saved days = %+v\nwant %+v", got, want)
	}
	// The span is [since, until) of whole days.
	if got, err := c.SavedDays(ctx(t), a.ID, day.AddDate(0, 0, 1), day.AddDate(0, 0, 2)); err != nil || len(got) != 1 || got[0].Mark != want[len(want)-2].Mark || len(got[0].Sums) != 0 {
		t.Errorf("saved days of the credit's day = %+v, %v; want its mark alone", got, err)
	}
	// A save replaces the day whole: the new mark, only the new sums.
	repl := tollgate.SavedDay{Mark: tollgate.DayMark{Day: day, Rows: 7, LastSeq: 70},
		Sums: []tollgate.ChargeDay{{Day: day, KeyID: k2.ID, Model: "n", Class: tollgate.ClassFallback, Requests: 1, Cost: usd("9223372.036854775807"), Uncollected: usd("0.000000000001")}}}
	if err := c.SaveDays(ctx(t), a.ID, since, []tollgate.SavedDay{repl}); err != nil {
		t.Fatal(err)
	}
	if d, ok := savedDay(t, c, a.ID, day); !ok || !equalDays([]tollgate.SavedDay{d}, []tollgate.SavedDay{repl}) {
		t.Errorf("the day after its replacement = %+v, want %+v", d, repl)
	}
	// A day saved with no sums loses the sums it had.
	repl.Sums = nil
	if err := c.SaveDays(ctx(t), a.ID, since, []tollgate.SavedDay{repl}); err != nil {
		t.Fatal(err)
	}
	if d, ok := savedDay(t, c, a.ID, day); !ok || d.Mark != repl.Mark || len(d.Sums) != 0 {
		t.Errorf("the day saved without sums = %+v", d)
	}
	// since deletes the account's days before it, and no other account's.
	if _, ok := savedDay(t, c, a.ID, day); !ok {
		t.Fatal("the first day is not saved")
	}
	if err := c.SaveDays(ctx(t), a.ID, day.AddDate(0, 0, 1), nil); err != nil {
		t.Fatal(err)
	}
	got, err = c.SavedDays(ctx(t), a.ID, since, until)
	if err != nil || !equalDays(got, want[len(want)-2:]) {
		t.Errorf("saved days after a save since the credit's day = %+v, %v; want %+v", got, err, want[len(want)-2:])
	}
	if got, err := c.SavedDays(ctx(t), b.ID, since, until); err != nil || !equalDays(got, other) {
		t.Errorf("the other account's saved days = %+v, %v; want %+v", got, err, other)
	}
}

func equalDays(a, b []tollgate.SavedDay) bool {
	return slices.EqualFunc(a, b, func(x, y tollgate.SavedDay) bool { return x.Mark == y.Mark && slices.Equal(x.Sums, y.Sums) })
}

// Savers of the same days at once (instances summing them from different
// marks) leave each day as one of them saved it: its mark with that save's
// sums, never one's mark with another's sums or a mix of two sums, as seen
// by readers during the saves and after them.
func testConsoleSaveDaysConcurrent(t *testing.T, s BillingStore, c tollgate.ConsoleStore) {
	a, _ := fundedKey(t, s, usd("1"), nil)
	base := t0.Truncate(24 * time.Hour)
	// Saver i saves its mark (Rows: i+1) with i+1 sums whose keys name it;
	// the last one a mark without sums. Savers 0 and 1 give the days in
	// opposite orders.
	const savers = 4
	save := func(i int, days []time.Time) []tollgate.SavedDay {
		var out []tollgate.SavedDay
		for _, d := range days {
			sd := tollgate.SavedDay{Mark: tollgate.DayMark{Day: d, Rows: int64(i + 1), LastSeq: int64(100 + i)}}
			for j := range i + 1 {
				if i < savers-1 {
					sd.Sums = append(sd.Sums, tollgate.ChargeDay{Day: d, KeyID: fmt.Sprintf("key_%d_%d", i, j), Model: "m", Requests: int64(i + 1), Cost: tollgate.Amount(i + 1)})
				}
			}
			out = append(out, sd)
		}
		return out
	}
	check := func(d tollgate.SavedDay) error {
		i := int(d.Mark.Rows) - 1
		if i < 0 || i >= savers || d.Mark.LastSeq != int64(100+i) {
			return fmt.Errorf("day %s: a mark no saver wrote: %+v", d.Mark.Day, d.Mark)
		}
		n := i + 1
		if i == savers-1 {
			n = 0
		}
		if len(d.Sums) != n {
			return fmt.Errorf("day %s: mark of saver %d with %d sums: %+v", d.Mark.Day, i, len(d.Sums), d.Sums)
		}
		for j, s := range d.Sums {
			if s.KeyID != fmt.Sprintf("key_%d_%d", i, j) || s.Requests != int64(i+1) || s.Cost != tollgate.Amount(i+1) {
				return fmt.Errorf("day %s: mark of saver %d with sums %+v", d.Mark.Day, i, d.Sums)
			}
		}
		return nil
	}
	const rounds = 15
	var stop sync.WaitGroup
	done := make(chan struct{})
	readErr := make(chan error, 1)
	stop.Add(1)
	go func() { // a reader throughout
		defer stop.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			ds, err := c.SavedDays(ctx(t), a.ID, base, base.AddDate(0, 0, rounds+1))
			if err == nil {
				for _, d := range ds {
					if err = check(d); err != nil {
						break
					}
				}
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	}()
	for r := range rounds {
		d0, d1 := base.AddDate(0, 0, r), base.AddDate(0, 0, r+1) // d0 saved before (but in round 0), d1 new
		var wg sync.WaitGroup
		errs := make([]error, savers)
		for i := range savers {
			days := []time.Time{d0, d1}
			if i == 1 {
				days = []time.Time{d1, d0}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = c.SaveDays(ctx(t), a.ID, base, save(i, days))
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, saver %d: %v", r, i, err)
			}
		}
		for _, day := range []time.Time{d0, d1} {
			d, ok := savedDay(t, c, a.ID, day)
			if !ok {
				t.Fatalf("round %d: day %s not saved", r, day)
			}
			if err := check(d); err != nil {
				t.Fatalf("round %d: %v", r, err)
			}
		}
	}
	close(done)
	stop.Wait()
	select {
	case err := <-readErr:
		t.Fatalf("a reader during the saves: %v", err)
	default:
	}
}

// The console's secret is made once: callers racing to store theirs all
// get the same one, and it stays.
func testConsoleSecret(t *testing.T, _ BillingStore, c tollgate.ConsoleStore) {
	const n = 6
	got := make([][]byte, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = c.ConsoleSecret(ctx(t), []byte{byte(i + 1), 42, 42, 42}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("secret %d: %v", i, errs[i])
		}
		if len(got[i]) != 4 || got[i][0] == 0 || string(got[i]) != string(got[0]) {
			t.Fatalf("racing callers got different secrets: %v", got)
		}
	}
	if again, err := c.ConsoleSecret(ctx(t), []byte("another")); err != nil || string(again) != string(got[0]) {
		t.Errorf("secret later = %q, %v; want the first one %q", again, err, got[0])
	}
}

// OperatorEntries lists the opening, credits and debits, newest first, with
// their notes and who made them, and never a charge.
func testConsoleOperatorEntries(t *testing.T, s BillingStore, c tollgate.ConsoleStore) {
	a, k := fundedKey(t, s, usd("1"), nil)
	other, _ := fundedKey(t, s, usd("1"), nil)
	if _, err := operator.Post(ctx(t), s, tollgate.LedgerCredit, a.ID, usd("2"), "invoice 7", "the CLI as ops@host", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	h := holdOp(a, k, usd("0.1"), t0.Add(2*time.Minute))
	apply(t, s, h)
	apply(t, s, settleOp(h, usd("0.05"), t0.Add(2*time.Minute)))
	if _, err := operator.Post(ctx(t), s, tollgate.LedgerDebit, a.ID, usd("0.5"), "goodwill back", "the operator console from 192.0.2.1", t0.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := operator.Post(ctx(t), s, tollgate.LedgerCredit, other.ID, usd("9"), "not alice's", "x", t0.Add(4*time.Minute)); err != nil {
		t.Fatal(err)
	}
	got, err := c.OperatorEntries(ctx(t), a.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		kind        tollgate.LedgerKind
		amount      tollgate.Amount
		note, actor string
	}
	var rows []row
	for _, e := range got {
		rows = append(rows, row{e.Kind, e.Amount, e.Note, e.Actor})
	}
	want := []row{
		{tollgate.LedgerDebit, -usd("0.5"), "goodwill back", "the operator console from 192.0.2.1"},
		{tollgate.LedgerCredit, usd("2"), "invoice 7", "the CLI as ops@host"},
	}
	if len(rows) < 2 || fmt.Sprint(rows[:2]) != fmt.Sprint(want) {
		t.Fatalf("operator entries = %+v, want %+v first", rows, want)
	}
	for _, r := range rows[2:] {
		if r.kind == tollgate.LedgerCharge || r.note == "not alice's" {
			t.Errorf("operator entries hold %+v", r)
		}
	}
	if one, err := c.OperatorEntries(ctx(t), a.ID, 1); err != nil || len(one) != 1 || one[0].Kind != tollgate.LedgerDebit {
		t.Errorf("limit 1 = %+v, %v; want the debit alone", one, err)
	}
	// The actor is kept in the ledger, not only returned.
	var actors []string
	if err := s.Ledger(ctx(t), tollgate.UsageFilter{AccountID: a.ID}, func(e tollgate.LedgerEntry) error {
		if e.Kind != tollgate.LedgerOpening {
			actors = append(actors, string(e.Kind)+":"+e.Actor)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if w := "[credit:the CLI as ops@host charge: debit:the operator console from 192.0.2.1]"; fmt.Sprint(actors) != w {
		t.Errorf("the ledger's actors = %v, want %s", actors, w)
	}
}
