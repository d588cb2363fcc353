package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/billing"
)

// TestLedgerRebuildKeepsRows builds a database as migrations 0001–0004 left
// it, with a ledger in it, then opens it (migration 0005 rebuilds the
// ledger) and checks that every row, its seq and the books survived, and
// that the rebuilt table still enforces what the old one did.
func TestLedgerRebuildKeepsRows(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	raw, err := sql.Open("sqlite", path+"?_foreign_keys=1&_journal_mode=WAL&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	raw.SetMaxOpenConns(1)
	if _, err := (&DB{w: raw}).migrateTo(ctx, 4); err != nil {
		t.Fatalf("migrations up to 0004: %v", err)
	}
	now := time.Now().UnixMicro()
	for _, q := range []string{
		`INSERT INTO accounts (id, name, balance, created) VALUES ('acct_a', 'a', 1000, ` + itoa(now) + `)`,
		`INSERT INTO api_keys (id, account_id, prefix, hash, created) VALUES ('key_a', 'acct_a', 'sk-tg-a', 'ab01', ` + itoa(now) + `)`,
		`INSERT INTO ledger (id, kind, account_id, amount, time, hold_id, key_id, model, class, node, prompt_tokens, completion_tokens, cost)
		 VALUES ('req_1', 'charge', 'acct_a', -30, ` + itoa(now+1) + `, 'hold_zz', 'key_a', 'm', 'network', 'n1', 10, 5, 30)`,
		`INSERT INTO ledger (id, kind, account_id, amount, note, time) VALUES ('le_c', 'credit', 'acct_a', 500, 'top-up', ` + itoa(now+2) + `)`,
		`INSERT INTO ledger (id, kind, account_id, amount, time, hold_id, key_id, model, class, node, prompt_tokens, completion_tokens, cost)
		 VALUES ('req_2', 'charge', 'acct_a', -70, ` + itoa(now+3) + `, 'hold_aa', 'key_a', 'm', 'fallback', '', 20, 9, 70)`,
		`UPDATE accounts SET balance = 1000 - 30 + 500 - 70 WHERE id = 'acct_a'`,
		`UPDATE api_keys SET spent = 100 WHERE id = 'key_a'`,
	} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	type row struct {
		seq  int64
		id   string
		hold sql.NullString
	}
	read := func(db *sql.DB) []row {
		rows, err := db.QueryContext(ctx, `SELECT seq, id, hold_id FROM ledger ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.seq, &r.id, &r.hold); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		return out
	}
	before := read(raw)
	raw.Close()
	if len(before) != 4 { // the opening entry from the trigger, two charges, a credit
		t.Fatalf("old ledger has %d rows: %+v", len(before), before)
	}

	db, err := Open(path)
	if err != nil {
		t.Fatalf("Open (migration 0005): %v", err)
	}
	defer db.Close()
	after := read(db.r)
	if len(after) != len(before) {
		t.Fatalf("rows after the rebuild: %+v, before: %+v", after, before)
	}
	for i := range before {
		if before[i] != after[i] {
			t.Errorf("row %d: %+v after, %+v before", i, after[i], before[i])
		}
	}
	var autoinc int
	if err := db.r.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE name = 'ledger' AND sql LIKE '%AUTOINCREMENT%'`).Scan(&autoinc); err != nil || autoinc != 0 {
		t.Errorf("ledger still AUTOINCREMENT (%d, %v)", autoinc, err)
	}
	// The trigger came back: a new account with a balance gets its opening entry.
	if err := db.CreateAccount(ctx, tollgate.Account{ID: "acct_b", Name: "b", Balance: 7, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	e, err := db.LedgerEntry(ctx, "le_open_acct_b")
	if err != nil || e.Amount != 7 || e.Seq <= before[len(before)-1].seq {
		t.Errorf("opening entry after the rebuild: %+v, %v (want seq above %d)", e, err, before[len(before)-1].seq)
	}
	// hold_id is still unique, the charge's id too.
	for _, q := range []string{
		`INSERT INTO ledger (id, kind, account_id, amount, time, hold_id) VALUES ('req_3', 'charge', 'acct_a', 0, 1, 'hold_zz')`,
		`INSERT INTO ledger (id, kind, account_id, amount, time, hold_id) VALUES ('req_1', 'charge', 'acct_a', 0, 1, 'hold_new')`,
	} {
		if _, err := db.w.ExecContext(ctx, q); !isUnique(err) {
			t.Errorf("%s: %v, want a UNIQUE violation", q, err)
		}
	}
	r, err := billing.Audit(ctx, db, time.Now(), time.Minute)
	if err != nil || !r.OK {
		t.Errorf("audit after the rebuild: %v, %v", r.Problems, err)
	}
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
