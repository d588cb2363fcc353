package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/paystore"
)

// The payments (tollgate.PaymentStore): the rules are paystore's, run in a
// write transaction here (BEGIN IMMEDIATE: one writer at a time, so the
// paystore's row locks are not needed and are dropped from its queries).

// querier is what a transaction and the read pool have in common.
type querier interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

// payTx adapts a transaction (or the read pool) to paystore.Tx.
type payTx struct {
	ctx context.Context
	q   querier
}

func payQuery(q string) string { return strings.TrimSuffix(q, " FOR UPDATE") }

func payArgs(args []any) []any {
	for i, a := range args {
		if t, ok := a.(time.Time); ok {
			args[i] = toMicros(t)
		}
	}
	return args
}

func (t payTx) Exec(q string, args ...any) (int64, error) {
	res, err := t.q.ExecContext(t.ctx, payQuery(q), payArgs(args)...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t payTx) QueryRow(q string, args ...any) paystore.Row {
	return payRow{t.q.QueryRowContext(t.ctx, payQuery(q), payArgs(args)...)}
}

func (t payTx) Query(q string, args ...any) (paystore.Rows, error) {
	rows, err := t.q.QueryContext(t.ctx, payQuery(q), payArgs(args)...)
	if err != nil {
		return nil, err
	}
	return payRows{rows}, nil
}

func (payTx) IsUnique(err error) bool { return isUnique(err) }

type payRow struct{ r *sql.Row }

func (r payRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return paystore.ErrNoRows
	}
	return err
}

type payRows struct{ *sql.Rows }

func (r payRows) Close() { r.Rows.Close() }

// payments is the paystore.Store of db.
func (db *DB) payments() paystore.Store {
	return paystore.Store{
		Write: func(ctx context.Context, fn func(tx paystore.Tx) error) error {
			err := db.write(ctx, func(tx *sql.Tx) error { return fn(payTx{ctx, tx}) })
			if err != nil && !paystore.IsDomain(err) {
				return fmt.Errorf("sqlite: payments: %w", err)
			}
			return err
		},
		Read: func(ctx context.Context) paystore.Tx { return payTx{ctx, db.r} },
	}
}
