// Package postgres is tollgate's store for several instances: tollgate.Store
// in PostgreSQL through pgx (pgxpool). Any number of stateless `tollgate
// serve` processes may share one database; migrations run under an advisory
// lock so that they may all start at once.
//
// Money is BIGINT picodollars (1e-12 USD), the scale of tollgate.Amount, so
// a balance check is an integer comparison inside one UPDATE.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate"
	"github.com/tollgate/tollgate/internal/migrations"
	"github.com/tollgate/tollgate/internal/paystore"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// migrationLock is the pg_advisory_xact_lock key held while migrating:
// the first 8 bytes of "tollgate" read as a big-endian int64.
const migrationLock int64 = 0x746f6c6c67617465

// DB is a tollgate.Store in PostgreSQL.
type DB struct {
	pool *pgxpool.Pool

	paystore.Store // payments (postgres/payments.go)
}

var _ tollgate.Store = (*DB)(nil)

// Open connects to the database at url (a postgres:// URL or a key=value
// connection string) and applies pending migrations.
func Open(ctx context.Context, url string) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse connection string: %w", redact(err))
	}
	return OpenConfig(ctx, cfg)
}

// OpenConfig is Open with a parsed pool configuration (tests use it to set
// search_path to a schema of their own).
func OpenConfig(ctx context.Context, cfg *pgxpool.Config) (*DB, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", redact(err))
	}
	db := &DB{pool: pool}
	db.Store = db.payments()
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connect: %w", redact(err))
	}
	if _, err := db.Migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return db, nil
}

// redact drops a connection error's text that could carry the password; pgx
// does not print passwords, but a parse error may echo the string it got.
func redact(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("invalid connection string")
	}
	return err
}

// Pool is the underlying connection pool (for the billing store and tests).
func (db *DB) Pool() *pgxpool.Pool { return db.pool }

// Close closes the pool.
func (db *DB) Close() error {
	db.pool.Close()
	return nil
}

// WALSyncs is how many times tollgate synced a write-ahead log itself: on
// PostgreSQL never (the server syncs its own), so 0, as SQLite's handle
// reports with synchronous=NORMAL.
func (db *DB) WALSyncs() int64 { return 0 }

// readMigrations reads the embedded files, migrations/NNNN_name.sql.
func readMigrations() ([]migrations.Migration, error) {
	ms, err := migrations.Read(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return ms, nil
}

// Migrate applies the embedded migrations the database has not seen, in
// order, in one transaction that first takes a transaction-scoped advisory
// lock: instances starting together queue on the lock, and each re-reads
// schema_migrations once it holds it, so every migration runs exactly once.
// It returns the names of the migrations it applied. Open calls it.
func (db *DB) Migrate(ctx context.Context) ([]string, error) {
	ms, err := readMigrations()
	if err != nil {
		return nil, err
	}
	var applied []string
	err = pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("advisory lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer     PRIMARY KEY,
			name    text        NOT NULL,
			applied timestamptz NOT NULL DEFAULT now()
		)`); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		rows, err := tx.Query(ctx, `SELECT version FROM schema_migrations`)
		if err != nil {
			return err
		}
		done, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return err
		}
		for _, m := range ms {
			if slices.Contains(done, int32(m.Version)) {
				continue
			}
			// No arguments: pgx sends it with the simple protocol, so a file
			// may hold several statements.
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("migration %s: %w", m.Name, err)
			}
			applied = append(applied, m.Name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	return applied, nil
}

// SchemaVersion returns the name of the last applied migration ("" if none).
func (db *DB) SchemaVersion(ctx context.Context) (string, error) {
	var name string
	err := db.pool.QueryRow(ctx, `SELECT name FROM schema_migrations ORDER BY version DESC LIMIT 1`).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("postgres: schema version: %w", err)
	}
	return name, nil
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

const (
	uniqueViolation     = "23505"
	foreignKeyViolation = "23503"
)

func conflict(what string, err error) error {
	return &tollgate.Error{Code: tollgate.CodeConflict, Message: what + " already exists", Err: err}
}

// Times are kept to the microsecond (timestamptz's precision; pgx truncates)
// and returned in UTC.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func fromNullTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// CreateAccount stores a new account. ID and Created must be set.
func (db *DB) CreateAccount(ctx context.Context, a tollgate.Account) error {
	if a.ID == "" || a.Created.IsZero() {
		return errors.New("postgres: create account: ID and Created are required")
	}
	_, err := db.pool.Exec(ctx,
		`INSERT INTO accounts (id, name, created, disabled, balance) VALUES ($1, $2, $3, $4, $5)`,
		a.ID, a.Name, a.Created, a.Disabled, int64(a.Balance))
	if pgCode(err) == uniqueViolation {
		return conflict("account "+a.ID, err)
	}
	if err != nil {
		return fmt.Errorf("postgres: create account %s: %w", a.ID, err)
	}
	return nil
}

const accountColumns = `a.id, a.name, a.created, a.disabled, a.balance`

func scanAccount(row pgx.Row, extra ...any) (tollgate.Account, error) {
	var a tollgate.Account
	var balance int64
	dest := append([]any{&a.ID, &a.Name, &a.Created, &a.Disabled, &balance}, extra...)
	if err := row.Scan(dest...); err != nil {
		return a, err
	}
	a.Created = a.Created.UTC()
	a.Balance = tollgate.Amount(balance)
	return a, nil
}

// Account returns one account, or tollgate.ErrNotFound.
func (db *DB) Account(ctx context.Context, id string) (tollgate.Account, error) {
	a, err := scanAccount(db.pool.QueryRow(ctx, `SELECT `+accountColumns+` FROM accounts a WHERE a.id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return a, fmt.Errorf("account %s: %w", id, tollgate.ErrNotFound)
	}
	if err != nil {
		return a, fmt.Errorf("postgres: account %s: %w", id, err)
	}
	return a, nil
}

// Accounts returns every account, oldest first.
func (db *DB) Accounts(ctx context.Context) ([]tollgate.Account, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+accountColumns+` FROM accounts a ORDER BY a.created, a.id`)
	if err != nil {
		return nil, fmt.Errorf("postgres: accounts: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tollgate.Account, error) { return scanAccount(r) })
	if err != nil {
		return nil, fmt.Errorf("postgres: accounts: %w", err)
	}
	if out == nil {
		out = []tollgate.Account{}
	}
	return out, nil
}

// bumpAuthVersion is appended to a change as a data-modifying CTE, so the
// change and the counter commit together in one statement.
const bumpAuthVersion = `UPDATE auth_version SET version = version + 1 WHERE id = 1`

// SetAccountDisabled sets the account's disabled flag and bumps AuthVersion.
// The operator's decision replaces a disable by payments (payment_hold):
// an account the operator disables is not enabled again by a won dispute.
func (db *DB) SetAccountDisabled(ctx context.Context, id string, disabled bool) error {
	var n int
	err := db.pool.QueryRow(ctx,
		`WITH changed AS (UPDATE accounts SET disabled = $2, payment_hold = false WHERE id = $1 RETURNING 1),
		      bumped AS (`+bumpAuthVersion+` AND EXISTS (SELECT 1 FROM changed))
		 SELECT count(*) FROM changed`, id, disabled).Scan(&n)
	if err != nil {
		return fmt.Errorf("postgres: set account %s disabled=%t: %w", id, disabled, err)
	}
	if n == 0 {
		return fmt.Errorf("set account %s disabled: %w", id, tollgate.ErrNotFound)
	}
	return nil
}

// CreateKey stores a key with the hash of its secret and bumps AuthVersion.
// ErrNotFound if the account does not exist.
func (db *DB) CreateKey(ctx context.Context, k tollgate.Key, h tollgate.KeyHash) error {
	if k.ID == "" || k.AccountID == "" || k.Created.IsZero() {
		return errors.New("postgres: create key: ID, AccountID and Created are required")
	}
	models := k.AllowedModels
	if models == nil {
		models = []string{}
	}
	_, err := db.pool.Exec(ctx,
		`WITH created AS (
		     INSERT INTO api_keys (id, account_id, name, prefix, hash, created, expires, revoked, allowed_models, spend_limit, rpm, tpm)
		     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING 1)
		 `+bumpAuthVersion+` AND EXISTS (SELECT 1 FROM created)`,
		k.ID, k.AccountID, k.Name, k.Prefix, h.String(), k.Created, nullTime(k.Expires), nullTime(k.Revoked), models,
		int64(k.SpendLimit), k.RPM, k.TPM)
	switch pgCode(err) {
	case "":
	case foreignKeyViolation:
		return fmt.Errorf("create key: account %s: %w", k.AccountID, tollgate.ErrNotFound)
	case uniqueViolation:
		return conflict("key", err) // the id or the hash; never say which hash
	}
	if err != nil {
		return fmt.Errorf("postgres: create key %s: %w", k.ID, err)
	}
	return nil
}

const keyColumns = `k.id, k.account_id, k.name, k.prefix, k.created, k.expires, k.revoked, k.allowed_models, k.spend_limit, k.rpm, k.tpm`

type keyScan struct {
	k                tollgate.Key
	expires, revoked *time.Time
}

func (s *keyScan) dest() []any {
	return []any{&s.k.ID, &s.k.AccountID, &s.k.Name, &s.k.Prefix, &s.k.Created, &s.expires, &s.revoked, &s.k.AllowedModels,
		(*int64)(&s.k.SpendLimit), &s.k.RPM, &s.k.TPM}
}

func (s *keyScan) key() tollgate.Key {
	k := s.k
	k.Created = k.Created.UTC()
	k.Expires = fromNullTime(s.expires)
	k.Revoked = fromNullTime(s.revoked)
	if k.AllowedModels == nil {
		k.AllowedModels = []string{}
	}
	return k
}

// KeyByHash returns the key with that hash and its account, or tollgate.ErrNotFound.
func (db *DB) KeyByHash(ctx context.Context, h tollgate.KeyHash) (tollgate.Key, tollgate.Account, error) {
	var s keyScan
	row := db.pool.QueryRow(ctx,
		`SELECT `+accountColumns+`, `+keyColumns+` FROM api_keys k JOIN accounts a ON a.id = k.account_id WHERE k.hash = $1`,
		h.String())
	a, err := scanAccount(row, s.dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return tollgate.Key{}, tollgate.Account{}, fmt.Errorf("key by hash: %w", tollgate.ErrNotFound)
	}
	if err != nil {
		return tollgate.Key{}, tollgate.Account{}, fmt.Errorf("postgres: key by hash: %w", err)
	}
	return s.key(), a, nil
}

// Keys returns the keys of one account (all accounts when accountID is ""), oldest first.
func (db *DB) Keys(ctx context.Context, accountID string) ([]tollgate.Key, error) {
	rows, err := db.pool.Query(ctx,
		`SELECT `+keyColumns+` FROM api_keys k WHERE $1 = '' OR k.account_id = $1 ORDER BY k.created, k.id`, accountID)
	if err != nil {
		return nil, fmt.Errorf("postgres: keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (tollgate.Key, error) {
		var s keyScan
		err := r.Scan(s.dest()...)
		return s.key(), err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: keys: %w", err)
	}
	if out == nil {
		out = []tollgate.Key{}
	}
	return out, nil
}

// RevokeKey marks the key revoked at at (a key already revoked keeps its
// first revocation time) and bumps AuthVersion. ErrNotFound if no such key.
func (db *DB) RevokeKey(ctx context.Context, id string, at time.Time) error {
	var n int
	err := db.pool.QueryRow(ctx,
		`WITH changed AS (UPDATE api_keys SET revoked = coalesce(revoked, $2) WHERE id = $1 RETURNING 1),
		      bumped AS (`+bumpAuthVersion+` AND EXISTS (SELECT 1 FROM changed))
		 SELECT count(*) FROM changed`, id, at).Scan(&n)
	if err != nil {
		return fmt.Errorf("postgres: revoke key %s: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("revoke key %s: %w", id, tollgate.ErrNotFound)
	}
	return nil
}

// AuthVersion returns the auth change counter.
func (db *DB) AuthVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := db.pool.QueryRow(ctx, `SELECT version FROM auth_version WHERE id = 1`).Scan(&v); err != nil {
		return 0, fmt.Errorf("postgres: auth version: %w", err)
	}
	return v, nil
}

// AddTraffic adds the counts to their hourly buckets in one statement
// (INSERT ... ON CONFLICT DO UPDATE is atomic per row, so instances adding to
// the same bucket at once never lose a count).
func (db *DB) AddTraffic(ctx context.Context, counts []tollgate.TrafficCount) error {
	var hours []time.Time
	var classes []string
	var reqs []int64
	// One statement may not touch a row twice: merge duplicates first.
	idx := map[[2]string]int{}
	for _, c := range counts {
		if c.Requests == 0 {
			continue
		}
		h := c.Hour.UTC().Truncate(time.Hour)
		k := [2]string{h.Format(time.RFC3339), string(c.Class)}
		if i, ok := idx[k]; ok {
			reqs[i] += c.Requests
			continue
		}
		idx[k] = len(hours)
		hours = append(hours, h)
		classes = append(classes, string(c.Class))
		reqs = append(reqs, c.Requests)
	}
	if len(hours) == 0 {
		return nil
	}
	_, err := db.pool.Exec(ctx,
		`INSERT INTO traffic (hour, class, requests)
		 SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::bigint[])
		 ON CONFLICT (hour, class) DO UPDATE SET requests = traffic.requests + excluded.requests`,
		hours, classes, reqs)
	if err != nil {
		return fmt.Errorf("postgres: add traffic: %w", err)
	}
	return nil
}

// Traffic returns the requests served by the network and in all, in buckets
// whose hour is at or after since.
func (db *DB) Traffic(ctx context.Context, since time.Time) (network, total int64, err error) {
	err = db.pool.QueryRow(ctx,
		`SELECT coalesce(sum(requests) FILTER (WHERE class = $2), 0)::bigint, coalesce(sum(requests), 0)::bigint
		 FROM traffic WHERE hour >= $1`, since, string(tollgate.ClassNetwork)).Scan(&network, &total)
	if err != nil {
		return 0, 0, fmt.Errorf("postgres: traffic: %w", err)
	}
	return network, total, nil
}
