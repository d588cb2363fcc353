package operator_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/operator"
	"github.com/tollgate/tollgate/postgres"
	"github.com/tollgate/tollgate/sqlite"
)

// testStore is what these tests drive: the operations' store, plus placing
// a hold and finding a key by its secret to see what the operations did.
type testStore interface {
	operator.Store
	ApplyBilling(ctx context.Context, ops []*tollgate.BillingOp) error
	KeyByHash(ctx context.Context, h tollgate.KeyHash) (tollgate.Key, tollgate.Account, error)
}

// onStores runs fn on a fresh SQLite store and a fresh PostgreSQL one (the
// latter skipped without TOLLGATE_TEST_POSTGRES).
func onStores(t *testing.T, fn func(t *testing.T, st testStore)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "t.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		fn(t, db)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		fn(t, postgres.OpenTest(t))
	})
}

var now = time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)

func usd(s string) tollgate.Amount { return tollgate.MustParseAmount(s) }

// invalid reports whether err is invalid_request naming param, its message
// starting with the field's name (what the CLI turns into its flag's).
func invalid(err error, param string) bool {
	var te *tollgate.Error
	return errors.As(err, &te) && te.Code == tollgate.CodeInvalidRequest && te.Param == param && strings.HasPrefix(te.Message, param)
}

func TestNewKeyValidatesLimits(t *testing.T) {
	catalogue := []string{"chat-1", "cheap-1"}
	for _, c := range []struct {
		name  string
		req   operator.KeyRequest
		param string
	}{
		{"no account", operator.KeyRequest{Name: "k"}, "account_id"},
		{"negative spend limit", operator.KeyRequest{AccountID: "acct_1", SpendLimit: -1}, "spend_limit"},
		{"negative rpm", operator.KeyRequest{AccountID: "acct_1", RPM: -1}, "rpm"},
		{"negative tpm", operator.KeyRequest{AccountID: "acct_1", TPM: -5}, "tpm"},
		{"expiry in the past", operator.KeyRequest{AccountID: "acct_1", Expires: "2001-01-01"}, "expires"},
		{"expiry not a time", operator.KeyRequest{AccountID: "acct_1", Expires: "someday"}, "expires"},
		{"zero duration", operator.KeyRequest{AccountID: "acct_1", Expires: "0d"}, "expires"},
		{"model not in the catalogue", operator.KeyRequest{AccountID: "acct_1", Models: []string{"chat-1", "gpt-9"}}, "models"},
	} {
		if _, err := operator.NewKey(c.req, catalogue, now); !invalid(err, c.param) {
			t.Errorf("%s: %v, want invalid_request naming %s", c.name, err, c.param)
		}
	}

	k, err := operator.NewKey(operator.KeyRequest{AccountID: "acct_1", Name: "  ci  ", Expires: "30d", Models: []string{"cheap-1", "chat-1", "cheap-1"},
		SpendLimit: usd("0.000000000001"), RPM: 60, TPM: 100_000}, catalogue, now)
	if err != nil {
		t.Fatal(err)
	}
	created := now.Truncate(time.Microsecond)
	if !strings.HasPrefix(k.ID, "key_") || k.AccountID != "acct_1" || k.Name != "ci" || !k.Created.Equal(created) ||
		!k.Expires.Equal(created.AddDate(0, 0, 30)) || !slices.Equal(k.AllowedModels, []string{"cheap-1", "chat-1"}) ||
		k.SpendLimit != 1 || k.RPM != 60 || k.TPM != 100_000 || k.Prefix != "" {
		t.Errorf("NewKey = %+v", k)
	}
	// No limits: zeros, every model, never expires; a nil catalogue checks no model.
	k, err = operator.NewKey(operator.KeyRequest{AccountID: "acct_1", Models: []string{"anything"}}, nil, now)
	if err != nil || !slices.Equal(k.AllowedModels, []string{"anything"}) || !k.Expires.IsZero() || k.SpendLimit != 0 || k.RPM != 0 {
		t.Errorf("NewKey without limits = %+v, %v", k, err)
	}
	k, err = operator.NewKey(operator.KeyRequest{AccountID: "acct_1"}, catalogue, now)
	if err != nil || k.AllowedModels == nil || len(k.AllowedModels) != 0 {
		t.Errorf("NewKey without models = %+v, %v; want an empty, non-nil list (all models)", k, err)
	}
}

func TestParseFilter(t *testing.T) {
	f, err := operator.ParseFilter("acct_1", "key_1", "chat-1", "network", "24h", "2026-03-01", now)
	if err != nil || f.AccountID != "acct_1" || f.KeyID != "key_1" || f.Model != "chat-1" || f.Class != tollgate.ClassNetwork ||
		!f.Since.Equal(now.Add(-24*time.Hour)) || !f.Until.Equal(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("ParseFilter = %+v, %v", f, err)
	}
	for param, args := range map[string][6]string{
		"backend": {"", "", "", "gpu", "", ""},
		"since":   {"", "", "", "", "yesterday", ""},
		"until":   {"", "", "", "", "", "-1h"},
	} {
		if _, err := operator.ParseFilter(args[0], args[1], args[2], args[3], args[4], args[5], now); tollgate.ErrorCode(err) != tollgate.CodeInvalidRequest ||
			!strings.Contains(err.Error(), param) {
			t.Errorf("ParseFilter with a bad %s: %v", param, err)
		}
	}
}

func TestCreditAndDebitAreExact(t *testing.T) {
	onStores(t, func(t *testing.T, st testStore) {
		ctx := t.Context()
		a, err := operator.CreateAccount(ctx, st, "  acme ", now)
		if err != nil || a.Name != "acme" || !strings.HasPrefix(a.ID, "acct_") || !a.Created.Equal(now.Truncate(time.Microsecond)) {
			t.Fatalf("CreateAccount = %+v, %v", a, err)
		}
		// Twelve decimals, the smallest amount, and a sum float64 would round.
		balance := tollgate.Amount(0)
		for _, s := range []string{"0.1", "0.2", "0.000000000001", "12.345678901234"} {
			p, err := operator.Post(ctx, st, tollgate.LedgerCredit, a.ID, usd(s), "top-up "+s, "the CLI as ops@host", now)
			balance += usd(s)
			if err != nil || p.Entry.Kind != tollgate.LedgerCredit || p.Entry.Amount != usd(s) || p.Entry.Note != "top-up "+s || p.Entry.Actor != "the CLI as ops@host" ||
				p.Balance.Balance != balance || p.Balance.Free != balance || p.Balance.Held != 0 {
				t.Fatalf("credit %s: %+v, %v; want balance %s", s, p, err, balance)
			}
		}
		if balance != usd("12.645678901235") {
			t.Fatalf("sum of credits %s", balance)
		}

		// A hold in flight: a debit may take the free balance, not more.
		k, err := operator.CreateKey(ctx, st, operator.KeyRequest{AccountID: a.ID}, nil, now)
		if err != nil {
			t.Fatal(err)
		}
		hold := &tollgate.BillingOp{Kind: tollgate.OpHold, Hold: tollgate.Hold{ID: tollgate.NewID("hold_"), RequestID: tollgate.NewID("req_"),
			AccountID: a.ID, KeyID: k.Key.ID, Model: "m", Class: tollgate.ClassNetwork, Amount: usd("2.645678901235"), Tokens: 1,
			Minute: now.Unix() / 60, Owner: "inst_test", Created: now, Expires: now.Add(time.Hour)}}
		if err := st.ApplyBilling(ctx, []*tollgate.BillingOp{hold}); err != nil || hold.Outcome != tollgate.HoldOK {
			t.Fatalf("hold: %v %v", hold.Outcome, err)
		}
		if _, err := operator.Post(ctx, st, tollgate.LedgerDebit, a.ID, usd("10.000000000001"), "", "", now); tollgate.ErrorCode(err) != tollgate.CodeInsufficientBalance {
			t.Fatalf("debit of the free balance plus 1e-12: %v, want insufficient_balance", err)
		}
		p, err := operator.Post(ctx, st, tollgate.LedgerDebit, a.ID, usd("10"), "refund", "", now)
		if err != nil || p.Entry.Kind != tollgate.LedgerDebit || p.Entry.Amount != -usd("10") ||
			p.Balance.Balance != usd("2.645678901235") || p.Balance.Held != usd("2.645678901235") || p.Balance.Free != 0 {
			t.Fatalf("debit of the whole free balance: %+v, %v", p, err)
		}
		v, err := operator.View(ctx, st, a)
		if err != nil || v.Balance != usd("2.645678901235") || v.Held != usd("2.645678901235") || v.Free != 0 || v.ID != a.ID {
			t.Errorf("View = %+v, %v", v, err)
		}

		// Refused before the store: nothing posted.
		for _, c := range []struct {
			kind   tollgate.LedgerKind
			amount tollgate.Amount
		}{{tollgate.LedgerCredit, 0}, {tollgate.LedgerDebit, -1}, {tollgate.LedgerCharge, 1}} {
			if _, err := operator.Post(ctx, st, c.kind, a.ID, c.amount, "", "", now); tollgate.ErrorCode(err) != tollgate.CodeInvalidRequest {
				t.Errorf("post %s of %s: %v, want invalid_request", c.kind, c.amount, err)
			}
		}
		if _, err := operator.Post(ctx, st, tollgate.LedgerCredit, "acct_nope", 1, "", "", now); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("credit of a missing account: %v, want ErrNotFound", err)
		}
		if v, _ := operator.View(ctx, st, a); v.Balance != usd("2.645678901235") {
			t.Errorf("balance after refused posts: %s", v.Balance)
		}
	})
}

func TestKeysAndAccounts(t *testing.T) {
	onStores(t, func(t *testing.T, st testStore) {
		ctx := t.Context()
		a, err := operator.CreateAccount(ctx, st, "a", now)
		if err != nil {
			t.Fatal(err)
		}
		b, err := operator.CreateAccount(ctx, st, "b", now)
		if err != nil {
			t.Fatal(err)
		}
		if keys, err := operator.ListKeys(ctx, st, a.ID); err != nil || keys == nil || len(keys) != 0 {
			t.Errorf("ListKeys of an account without keys = %#v, %v; want an empty list", keys, err)
		}
		if _, err := operator.ListKeys(ctx, st, "acct_nope"); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("ListKeys of a missing account: %v", err)
		}

		req := operator.KeyRequest{AccountID: a.ID, Name: "ci", Models: []string{"chat-1"}, SpendLimit: usd("0.000070000001"), RPM: 100, TPM: 100_000, Expires: "720h"}
		created, err := operator.CreateKey(ctx, st, req, []string{"chat-1"}, now)
		if err != nil {
			t.Fatal(err)
		}
		if !tollgate.LooksLikeKey(created.Secret) || created.Key.Prefix != tollgate.DisplayPrefix(created.Secret) {
			t.Errorf("secret %q, prefix %q", created.Secret, created.Key.Prefix)
		}
		stored, owner, err := st.KeyByHash(ctx, tollgate.HashKey(created.Secret))
		if err != nil || owner.ID != a.ID || stored.ID != created.Key.ID || stored.SpendLimit != usd("0.000070000001") || stored.RPM != 100 ||
			stored.TPM != 100_000 || !slices.Equal(stored.AllowedModels, []string{"chat-1"}) || !stored.Expires.Equal(now.Truncate(time.Microsecond).Add(720*time.Hour)) {
			t.Errorf("stored key = %+v (account %s), %v; want %+v", stored, owner.ID, err, created.Key)
		}
		// Refused: a missing account (nothing stored), a limit out of range.
		if _, err := operator.CreateKey(ctx, st, operator.KeyRequest{AccountID: "acct_nope"}, nil, now); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("key of a missing account: %v, want ErrNotFound", err)
		}
		if _, err := operator.CreateKey(ctx, st, operator.KeyRequest{AccountID: a.ID, RPM: -1}, nil, now); !invalid(err, "rpm") {
			t.Errorf("key with rpm -1: %v", err)
		}
		if keys, _ := operator.ListKeys(ctx, st, ""); len(keys) != 1 {
			t.Errorf("keys after refused creations: %+v", keys)
		}

		// Another account cannot revoke it; its own account and the operator can, once.
		if _, err := operator.RevokeKey(ctx, st, b.ID, created.Key.ID, now); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("revoke through another account: %v, want ErrNotFound", err)
		}
		if k, _, _ := st.KeyByHash(ctx, tollgate.HashKey(created.Secret)); !k.Revoked.IsZero() {
			t.Fatal("revoked through another account")
		}
		first := now.Add(time.Minute)
		k, err := operator.RevokeKey(ctx, st, a.ID, created.Key.ID, first)
		if err != nil || !k.Revoked.Equal(first.Truncate(time.Microsecond)) || k.ID != created.Key.ID {
			t.Fatalf("revoke = %+v, %v", k, err)
		}
		k, err = operator.RevokeKey(ctx, st, "", created.Key.ID, first.Add(time.Hour))
		if err != nil || !k.Revoked.Equal(first.Truncate(time.Microsecond)) {
			t.Errorf("revoked twice = %+v, %v; want the first time kept", k, err)
		}
		if _, err := operator.RevokeKey(ctx, st, "", "key_nope", now); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("revoke a missing key: %v", err)
		}

		if acct, err := operator.SetDisabled(ctx, st, a.ID, true); err != nil || !acct.Disabled || acct.ID != a.ID {
			t.Errorf("disable = %+v, %v", acct, err)
		}
		if acct, err := operator.SetDisabled(ctx, st, a.ID, false); err != nil || acct.Disabled {
			t.Errorf("enable = %+v, %v", acct, err)
		}
		if _, err := operator.SetDisabled(ctx, st, "acct_nope", true); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("disable a missing account: %v", err)
		}

		inv, err := operator.Invite(ctx, st, a.ID, now)
		if err != nil || inv.AccountID != a.ID || !strings.HasPrefix(inv.Path, "/console/invite?token=inv-") ||
			!inv.Expires.Equal(now.Truncate(time.Microsecond).Add(tollgate.InviteTTL)) {
			t.Errorf("Invite = %+v, %v", inv, err)
		}
		if _, err := operator.Invite(ctx, st, "acct_nope", now); !errors.Is(err, tollgate.ErrNotFound) {
			t.Errorf("invite to a missing account: %v", err)
		}
	})
}
