// Package sqlite is tollgate's embedded store: tollgate.Store in one SQLite
// file, through the pure-Go driver modernc.org/sqlite (no cgo, so the binary
// builds and `go run` works without a C compiler; see docs/performance.md,
// "SQLite driver", for the measurement against mattn/go-sqlite3).
//
// The file runs in WAL mode (readers never block the writer) with a busy
// timeout and foreign keys on. Writes go through one connection that starts
// every transaction with BEGIN IMMEDIATE: inside a process writers queue in
// database/sql instead of racing for SQLite's lock, and across processes (a
// CLI beside `tollgate serve`) the write lock is taken up front, where the
// busy timeout can wait for it, rather than upgraded mid-transaction, where
// SQLite would fail at once with "database is locked".
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers driver "sqlite"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/migrations"
	"github.com/tollgate/tollgate/internal/paystore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// busyTimeout is how long a connection waits for another process's write lock.
const busyTimeout = 10 * time.Second

// DB is a tollgate.Store in one SQLite file.
type DB struct {
	path string
	w    *sql.DB  // exactly one connection, BEGIN IMMEDIATE: all writes
	r    *sql.DB  // a pool of read-only connections: all reads
	wal  *walSync // syncs the WAL before a commit is acknowledged; nil with synchronous=NORMAL

	// Prepared once: parsing SQL costs more than running these point queries.
	keyByHash, authVersion *sql.Stmt
	bill                   billStmts // billing statements on the writer (sqlite/billing.go)

	idem idemQueue // Idempotency-Key writes waiting for a group commit

	paystore.Store // payments (sqlite/payments.go)
}

var _ tollgate.Store = (*DB)(nil)

// driver names a database/sql driver for SQLite; both modernc.org/sqlite and
// mattn/go-sqlite3 accept the same DSN parameters.
// synchronous is the PRAGMA synchronous value ("" means FULL; the driver
// benchmark also measures NORMAL).
//
// syncWAL opens SQLite with synchronous=NORMAL and has the store fdatasync
// the WAL before it acknowledges a commit (walsync.go): the default, as
// durable as FULL for less CPU.
type driver struct {
	name, label, synchronous string
	syncWAL                  bool
}

var moderncDriver = driver{name: "sqlite", label: "modernc", synchronous: "NORMAL", syncWAL: true}

// Open opens (creating it if needed) the SQLite database at path and applies
// pending migrations. path is a plain file path; it must not contain '?'.
func Open(path string) (*DB, error) {
	return open(context.Background(), moderncDriver, path)
}

// OpenSynchronous is Open with the durability of store.sqlite_synchronous:
// "FULL" (the default: a commit survives a power loss; the store fdatasyncs
// the WAL before acknowledging it, walsync.go) or "NORMAL" (in WAL mode a
// commit survives a process crash, and the last commits may be lost on a
// power loss or an OS crash, never the database's consistency).
func OpenSynchronous(path, synchronous string) (*DB, error) {
	switch strings.ToUpper(synchronous) {
	case "", "FULL":
		return Open(path)
	case "NORMAL":
		return open(context.Background(), driver{name: moderncDriver.name, label: "modernc-sync-normal", synchronous: "NORMAL"}, path)
	}
	return nil, fmt.Errorf("sqlite: synchronous %q: want FULL or NORMAL", synchronous)
}

func open(ctx context.Context, d driver, path string) (*DB, error) {
	if path == "" {
		return nil, errors.New("sqlite: empty database path")
	}
	if strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("sqlite: database path %q must not contain '?'", path)
	}
	if dir := filepath.Dir(path); dir != "." {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("sqlite: create directory of %s: %w", path, err)
		}
	}
	// synchronous=FULL: a committed charge or credit survives a power loss,
	// not only a process crash (NORMAL would only guarantee the latter in WAL mode).
	sync := d.synchronous
	if sync == "" {
		sync = "FULL"
	}
	var wal *walSync
	if d.syncWAL {
		wal = newWALSync(path)
	}
	common := "_busy_timeout=" + strconv.Itoa(int(busyTimeout/time.Millisecond)) +
		"&_journal_mode=WAL&_foreign_keys=1&_synchronous=" + sync
	w, err := sql.Open(d.name, path+"?"+common+"&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	db := &DB{path: path, w: w, wal: wal}
	// The writer connection is opened first so that WAL mode is set (it is
	// persistent in the file) before any reader connects. Switching a new
	// file to WAL needs an exclusive lock that SQLite does not wait for: a
	// process opening the file while another sets it up gets SQLITE_BUSY at
	// once, so the connection is retried for up to the busy timeout.
	for start := time.Now(); ; {
		err := w.PingContext(ctx)
		if err == nil {
			break
		}
		if !isBusy(err) || time.Since(start) > busyTimeout || ctx.Err() != nil {
			w.Close()
			return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	r, err := sql.Open(d.name, path+"?"+common+"&_query_only=1")
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	db.r = r
	if _, err := db.Migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if db.keyByHash, err = r.PrepareContext(ctx,
		`SELECT `+accountColumns+`, `+keyColumns+` FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE k.hash = ?`); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: prepare: %w", err)
	}
	if db.authVersion, err = r.PrepareContext(ctx, `SELECT version FROM auth_version WHERE id = 1`); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: prepare: %w", err)
	}
	if err := db.prepareBilling(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: prepare: %w", err)
	}
	db.Store = db.payments()
	return db, nil
}

// Path is the database file.
func (db *DB) Path() string { return db.path }

// Close closes both connection pools.
func (db *DB) Close() error {
	for _, st := range []*sql.Stmt{db.keyByHash, db.authVersion} {
		if st != nil {
			st.Close()
		}
	}
	var errR error
	if db.r != nil {
		errR = db.r.Close()
	}
	errW := db.w.Close()
	if db.wal != nil {
		db.wal.close()
	}
	return errors.Join(errW, errR)
}

// readMigrations reads the embedded files, migrations/NNNN_name.sql.
func readMigrations() ([]migrations.Migration, error) {
	ms, err := migrations.Read(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	return ms, nil
}

// Migrate applies the embedded migrations that the database has not seen, in
// order, each in its own transaction recorded in schema_migrations, and
// returns the names of those it applied. Several processes may call it at
// once: BEGIN IMMEDIATE serialises them and each re-reads what is applied.
// Open calls it; `tollgate migrate` calls it too.
func (db *DB) Migrate(ctx context.Context) ([]string, error) {
	return db.migrateTo(ctx, int(^uint(0)>>1))
}

// migrateTo applies the migrations up to version upTo (tests build old schemas with it).
func (db *DB) migrateTo(ctx context.Context, upTo int) ([]string, error) {
	ms, err := readMigrations()
	if err != nil {
		return nil, err
	}
	if _, err := db.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY,
		name    TEXT    NOT NULL,
		applied INTEGER NOT NULL
	) STRICT`); err != nil {
		return nil, fmt.Errorf("sqlite: create schema_migrations: %w", err)
	}
	var applied []string
	for _, m := range ms {
		if m.Version > upTo {
			break
		}
		done, err := db.applyMigration(ctx, m)
		if err != nil {
			return applied, fmt.Errorf("sqlite: migration %s: %w", m.Name, err)
		}
		if done {
			applied = append(applied, m.Name)
		}
	}
	return applied, nil
}

func (db *DB) applyMigration(ctx context.Context, m migrations.Migration) (bool, error) {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = ?`, m.Version).Scan(&n); err != nil {
		return false, err
	}
	if n > 0 {
		return false, nil
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied) VALUES (?, ?, ?)`,
		m.Version, m.Name, time.Now().UnixMicro()); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	db.durable()
	return true, nil
}

// SchemaVersion returns the name of the last applied migration ("" if none).
func (db *DB) SchemaVersion(ctx context.Context) (string, error) {
	var name string
	err := db.r.QueryRowContext(ctx, `SELECT name FROM schema_migrations ORDER BY version DESC LIMIT 1`).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("sqlite: schema version: %w", err)
	}
	return name, nil
}

// write runs fn in one write transaction (BEGIN IMMEDIATE on the writer
// connection) and returns once it is committed and durable.
func (db *DB) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	durable, err := db.writeCommitted(ctx, fn)
	if err != nil {
		return err
	}
	durable()
	return nil
}

// writeCommitted is write without the wait for durability: durable returns
// once the transaction is on disk (walsync.go). Nothing may be reported to
// anyone before durable returns.
func (db *DB) writeCommitted(ctx context.Context, fn func(tx *sql.Tx) error) (durable func(), err error) {
	tx, err := db.w.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	if db.wal == nil {
		return func() {}, nil
	}
	seq := db.wal.commit()
	return func() { db.wal.wait(seq) }, nil
}

// durable returns once everything committed so far is on disk (walsync.go);
// writes outside write call it after their commit, before they report success.
func (db *DB) durable() {
	if db.wal != nil {
		db.wal.done()
	}
}

// execDurable runs one write statement in its own transaction and syncs it.
func (db *DB) execDurable(ctx context.Context, q string, args ...any) (sql.Result, error) {
	res, err := db.w.ExecContext(ctx, q, args...)
	if err == nil {
		db.durable()
	}
	return res, err
}

func bumpAuthVersion(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `UPDATE auth_version SET version = version + 1 WHERE id = 1`)
	return err
}

// Times are stored as unix microseconds: PostgreSQL's precision, so both
// stores return the same values.
func toMicros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

func nullMicros(t time.Time) sql.NullInt64 {
	if t.IsZero() {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMicro(), Valid: true}
}

func fromNullMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMicros(v.Int64)
}

func conflict(what string, err error) error {
	return &tollgate.Error{Code: tollgate.CodeConflict, Message: what + " already exists", Err: err}
}

// isConstraint reports a UNIQUE or PRIMARY KEY violation (both drivers say so in the message).
func isUnique(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// isBusy: SQLite gave up on a lock (SQLITE_BUSY, "database is locked").
func isBusy(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "SQLITE_BUSY") || strings.Contains(err.Error(), "database is locked"))
}

func isForeignKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "FOREIGN KEY constraint failed")
}

// CreateAccount stores a new account. ID and Created must be set.
func (db *DB) CreateAccount(ctx context.Context, a tollgate.Account) error {
	if a.ID == "" || a.Created.IsZero() {
		return errors.New("sqlite: create account: ID and Created are required")
	}
	_, err := db.execDurable(ctx,
		`INSERT INTO accounts (id, name, created, disabled, balance) VALUES (?, ?, ?, ?, ?)`,
		a.ID, a.Name, toMicros(a.Created), a.Disabled, int64(a.Balance))
	if isUnique(err) {
		return conflict("account "+a.ID, err)
	}
	if err != nil {
		return fmt.Errorf("sqlite: create account %s: %w", a.ID, err)
	}
	return nil
}

const accountColumns = `a.id, a.name, a.created, a.disabled, a.balance`

type scanner interface{ Scan(dest ...any) error }

func scanAccount(s scanner, extra ...any) (tollgate.Account, error) {
	var a tollgate.Account
	var created, balance int64
	dest := append([]any{&a.ID, &a.Name, &created, &a.Disabled, &balance}, extra...)
	if err := s.Scan(dest...); err != nil {
		return a, err
	}
	a.Created = fromMicros(created)
	a.Balance = tollgate.Amount(balance)
	return a, nil
}

// Account returns one account, or tollgate.ErrNotFound.
func (db *DB) Account(ctx context.Context, id string) (tollgate.Account, error) {
	a, err := scanAccount(db.r.QueryRowContext(ctx, `SELECT `+accountColumns+` FROM accounts a WHERE a.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return a, fmt.Errorf("account %s: %w", id, tollgate.ErrNotFound)
	}
	if err != nil {
		return a, fmt.Errorf("sqlite: account %s: %w", id, err)
	}
	return a, nil
}

// Accounts returns every account, oldest first.
func (db *DB) Accounts(ctx context.Context) ([]tollgate.Account, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+accountColumns+` FROM accounts a ORDER BY a.created, a.id`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: accounts: %w", err)
	}
	defer rows.Close()
	out := []tollgate.Account{}
	for rows.Next() {
		a, err := scanAccount(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: accounts: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: accounts: %w", err)
	}
	return out, nil
}

// SetAccountDisabled sets the account's disabled flag and bumps AuthVersion.
// The operator's decision replaces a disable by payments (payment_hold):
// an account the operator disables is not enabled again by a won dispute.
func (db *DB) SetAccountDisabled(ctx context.Context, id string, disabled bool) error {
	err := db.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE accounts SET disabled = ?, payment_hold = 0 WHERE id = ?`, disabled, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return tollgate.ErrNotFound
		}
		return bumpAuthVersion(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("sqlite: set account %s disabled=%t: %w", id, disabled, err)
	}
	return nil
}

// CreateKey stores a key with the hash of its secret and bumps AuthVersion
// (a negative cache entry for that hash must go). ErrNotFound if the account
// does not exist.
func (db *DB) CreateKey(ctx context.Context, k tollgate.Key, h tollgate.KeyHash) error {
	if k.ID == "" || k.AccountID == "" || k.Created.IsZero() {
		return errors.New("sqlite: create key: ID, AccountID and Created are required")
	}
	models := k.AllowedModels
	if models == nil {
		models = []string{}
	}
	modelsJSON, err := json.Marshal(models)
	if err != nil {
		return err
	}
	err = db.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO api_keys (id, account_id, name, prefix, hash, created, expires, revoked, allowed_models, spend_limit, rpm, tpm)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			k.ID, k.AccountID, k.Name, k.Prefix, h.String(), toMicros(k.Created),
			nullMicros(k.Expires), nullMicros(k.Revoked), string(modelsJSON), int64(k.SpendLimit), k.RPM, k.TPM); err != nil {
			return err
		}
		return bumpAuthVersion(ctx, tx)
	})
	switch {
	case isForeignKey(err):
		return fmt.Errorf("create key: account %s: %w", k.AccountID, tollgate.ErrNotFound)
	case isUnique(err):
		return conflict("key", err) // the id or the hash; never say which hash
	case err != nil:
		return fmt.Errorf("sqlite: create key %s: %w", k.ID, err)
	}
	return nil
}

const keyColumns = `k.id, k.account_id, k.name, k.prefix, k.created, k.expires, k.revoked, k.allowed_models, k.spend_limit, k.rpm, k.tpm`

func keyDest(k *tollgate.Key, created *int64, expires, revoked *sql.NullInt64, models *string) []any {
	return []any{&k.ID, &k.AccountID, &k.Name, &k.Prefix, created, expires, revoked, models, &k.SpendLimit, &k.RPM, &k.TPM}
}

func finishKey(k *tollgate.Key, created int64, expires, revoked sql.NullInt64, models string) error {
	k.Created = fromMicros(created)
	k.Expires = fromNullMicros(expires)
	k.Revoked = fromNullMicros(revoked)
	k.AllowedModels = []string{}
	if err := json.Unmarshal([]byte(models), &k.AllowedModels); err != nil {
		return fmt.Errorf("key %s: allowed_models: %w", k.ID, err)
	}
	return nil
}

// KeyByHash returns the key with that hash and its account, or tollgate.ErrNotFound.
func (db *DB) KeyByHash(ctx context.Context, h tollgate.KeyHash) (tollgate.Key, tollgate.Account, error) {
	var k tollgate.Key
	var created int64
	var expires, revoked sql.NullInt64
	var models string
	row := db.keyByHash.QueryRowContext(ctx, h.String())
	a, err := scanAccount(row, keyDest(&k, &created, &expires, &revoked, &models)...)
	if errors.Is(err, sql.ErrNoRows) {
		return k, a, fmt.Errorf("key by hash: %w", tollgate.ErrNotFound)
	}
	if err == nil {
		err = finishKey(&k, created, expires, revoked, models)
	}
	if err != nil {
		return k, a, fmt.Errorf("sqlite: key by hash: %w", err)
	}
	return k, a, nil
}

// Keys returns the keys of one account (all accounts when accountID is ""), oldest first.
func (db *DB) Keys(ctx context.Context, accountID string) ([]tollgate.Key, error) {
	q := `SELECT ` + keyColumns + ` FROM api_keys k`
	var args []any
	if accountID != "" {
		q += ` WHERE k.account_id = ?`
		args = append(args, accountID)
	}
	rows, err := db.r.QueryContext(ctx, q+` ORDER BY k.created, k.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: keys: %w", err)
	}
	defer rows.Close()
	out := []tollgate.Key{}
	for rows.Next() {
		var k tollgate.Key
		var created int64
		var expires, revoked sql.NullInt64
		var models string
		if err := rows.Scan(keyDest(&k, &created, &expires, &revoked, &models)...); err != nil {
			return nil, fmt.Errorf("sqlite: keys: %w", err)
		}
		if err := finishKey(&k, created, expires, revoked, models); err != nil {
			return nil, fmt.Errorf("sqlite: keys: %w", err)
		}
		out = append(out, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: keys: %w", err)
	}
	return out, nil
}

// RevokeKey marks the key revoked at at (a key already revoked keeps its
// first revocation time) and bumps AuthVersion. ErrNotFound if no such key.
func (db *DB) RevokeKey(ctx context.Context, id string, at time.Time) error {
	err := db.write(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked = coalesce(revoked, ?) WHERE id = ?`, toMicros(at), id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return tollgate.ErrNotFound
		}
		return bumpAuthVersion(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("sqlite: revoke key %s: %w", id, err)
	}
	return nil
}

// AuthVersion returns the auth change counter.
func (db *DB) AuthVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := db.authVersion.QueryRowContext(ctx).Scan(&v); err != nil {
		return 0, fmt.Errorf("sqlite: auth version: %w", err)
	}
	return v, nil
}

// AddTraffic adds the counts to their hourly buckets in one transaction.
func (db *DB) AddTraffic(ctx context.Context, counts []tollgate.TrafficCount) error {
	if len(counts) == 0 {
		return nil
	}
	err := db.write(ctx, func(tx *sql.Tx) error {
		for _, c := range counts {
			if c.Requests == 0 {
				continue
			}
			if _, err := tx.ExecContext(ctx,
				`INSERT INTO traffic (hour, class, requests) VALUES (?, ?, ?)
				 ON CONFLICT (hour, class) DO UPDATE SET requests = requests + excluded.requests`,
				c.Hour.UTC().Truncate(time.Hour).Unix(), string(c.Class), c.Requests); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqlite: add traffic: %w", err)
	}
	return nil
}

// Traffic returns the requests served by the network and in all, in buckets
// whose hour is at or after since.
func (db *DB) Traffic(ctx context.Context, since time.Time) (network, total int64, err error) {
	err = db.r.QueryRowContext(ctx,
		`SELECT coalesce(sum(CASE WHEN class = ? THEN requests ELSE 0 END), 0), coalesce(sum(requests), 0)
		 FROM traffic WHERE hour >= ?`,
		string(tollgate.ClassNetwork), since.Unix()).Scan(&network, &total)
	if err != nil {
		return 0, 0, fmt.Errorf("sqlite: traffic: %w", err)
	}
	return network, total, nil
}

// Pragmas returns the settings a writer connection runs with (journal_mode,
// foreign_keys, busy_timeout, synchronous), and "wal_sync": "fdatasync" when
// the store syncs the WAL itself before acknowledging a commit (walsync.go).
func (db *DB) Pragmas(ctx context.Context) map[string]string {
	out := map[string]string{}
	if db.wal != nil {
		out["wal_sync"] = "fdatasync"
	}
	for _, p := range []string{"journal_mode", "foreign_keys", "busy_timeout", "synchronous"} {
		var v string
		if err := db.w.QueryRowContext(ctx, "PRAGMA "+p).Scan(&v); err == nil {
			out[p] = v
		}
	}
	return out
}
