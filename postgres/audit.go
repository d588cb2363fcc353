package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate"
)

// RecordAudit keeps the run and deletes the runs beyond the newest
// tollgate.AuditRunsKept, in one transaction. The table's lock (which
// readers do not wait for) orders concurrent recorders, so that each one's
// trim sees the others' runs and the table never stays above the bound.
func (db *DB) RecordAudit(ctx context.Context, run tollgate.AuditRun) error {
	problems := run.KeptProblems()
	if problems == nil {
		problems = []string{} // text[] NOT NULL
	}
	err := pgx.BeginFunc(ctx, db.pool, func(tx pgx.Tx) error {
		// Alone, before the batch: the batch's statements are parsed
		// before any runs, and parsing the INSERT takes a weaker lock
		// first, which two recorders would then both want to upgrade.
		if _, err := tx.Exec(ctx, `LOCK TABLE audit_runs IN EXCLUSIVE MODE`); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO audit_runs (time, source, ok, accounts, keys, balance, held, problems, problem_count, took_us)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			run.Time.UTC(), string(run.Source), run.OK, run.Accounts, run.Keys, int64(run.Balance), int64(run.Held),
			problems, run.ProblemCount, run.Took.Microseconds())
		b.Queue(`DELETE FROM audit_runs WHERE id NOT IN
			(SELECT id FROM audit_runs ORDER BY time DESC, id DESC LIMIT $1)`, tollgate.AuditRunsKept)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("postgres: record audit: %w", err)
	}
	return nil
}

// LastAudit returns the newest run; ErrNotFound when none was recorded.
func (db *DB) LastAudit(ctx context.Context) (tollgate.AuditRun, error) {
	var run tollgate.AuditRun
	var balance, held, took int64
	var source string
	err := db.pool.QueryRow(ctx, `SELECT time, source, ok, accounts, keys, balance, held, problems, problem_count, took_us
		FROM audit_runs ORDER BY time DESC, id DESC LIMIT 1`).
		Scan(&run.Time, &source, &run.OK, &run.Accounts, &run.Keys, &balance, &held, &run.Problems, &run.ProblemCount, &took)
	if errors.Is(err, pgx.ErrNoRows) {
		return run, tollgate.ErrNotFound
	}
	if err != nil {
		return run, fmt.Errorf("postgres: last audit: %w", err)
	}
	run.Time, run.Source, run.Balance, run.Held = run.Time.UTC(), tollgate.AuditSource(source), tollgate.Amount(balance), tollgate.Amount(held)
	run.Took = time.Duration(took) * time.Microsecond
	if len(run.Problems) == 0 {
		run.Problems = nil
	}
	return run, nil
}
