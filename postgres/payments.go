package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tollgate/tollgate/internal/paystore"
)

// The payments (tollgate.PaymentStore): the rules are paystore's, run here
// in a READ COMMITTED transaction whose row locks (FOR UPDATE on the
// payment, then its account) serialise the operations on one payment
// across instances.

// pgQuerier is what a transaction and the pool have in common.
type pgQuerier interface {
	Exec(ctx context.Context, q string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, q string, args ...any) pgx.Row
	Query(ctx context.Context, q string, args ...any) (pgx.Rows, error)
}

// payTx adapts a transaction (or the pool) to paystore.Tx.
type payTx struct {
	ctx context.Context
	q   pgQuerier
}

// payQuery numbers paystore's `?` placeholders ($1, $2, ...).
func payQuery(q string) string {
	var b strings.Builder
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

func (t payTx) Exec(q string, args ...any) (int64, error) {
	tag, err := t.q.Exec(t.ctx, payQuery(q), args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (t payTx) QueryRow(q string, args ...any) paystore.Row {
	return payRow{t.q.QueryRow(t.ctx, payQuery(q), args...)}
}

func (t payTx) Query(q string, args ...any) (paystore.Rows, error) {
	rows, err := t.q.Query(t.ctx, payQuery(q), args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

func (payTx) IsUnique(err error) bool { return pgCode(err) == uniqueViolation }

type payRow struct{ r pgx.Row }

func (r payRow) Scan(dest ...any) error {
	err := r.r.Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return paystore.ErrNoRows
	}
	return err
}

// payments is the paystore.Store of db.
func (db *DB) payments() paystore.Store {
	return paystore.Store{
		Write: func(ctx context.Context, fn func(tx paystore.Tx) error) error {
			err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error { return fn(payTx{ctx, tx}) })
			if err != nil && !paystore.IsDomain(err) {
				return fmt.Errorf("postgres: payments: %w", err)
			}
			return err
		},
		Read: func(ctx context.Context) paystore.Tx { return payTx{ctx, db.pool} },
	}
}
