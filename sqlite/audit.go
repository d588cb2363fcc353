package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tollgate/tollgate"
)

// RecordAudit keeps the run and deletes the runs beyond the newest
// tollgate.AuditRunsKept, in one transaction.
func (db *DB) RecordAudit(ctx context.Context, run tollgate.AuditRun) error {
	problems, err := json.Marshal(nonNil(run.KeptProblems()))
	if err != nil {
		return fmt.Errorf("sqlite: record audit: %w", err)
	}
	err = db.write(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit_runs (time, source, ok, accounts, keys, balance, held, problems, problem_count, took_us)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			toMicros(run.Time), string(run.Source), run.OK, run.Accounts, run.Keys, int64(run.Balance), int64(run.Held),
			string(problems), run.ProblemCount, run.Took.Microseconds()); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM audit_runs WHERE id NOT IN
			(SELECT id FROM audit_runs ORDER BY time DESC, id DESC LIMIT ?)`, tollgate.AuditRunsKept)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlite: record audit: %w", err)
	}
	return nil
}

// LastAudit returns the newest run; ErrNotFound when none was recorded.
func (db *DB) LastAudit(ctx context.Context) (tollgate.AuditRun, error) {
	var run tollgate.AuditRun
	var at, balance, held, took int64
	var source, problems string
	err := db.r.QueryRowContext(ctx, `SELECT time, source, ok, accounts, keys, balance, held, problems, problem_count, took_us
		FROM audit_runs ORDER BY time DESC, id DESC LIMIT 1`).
		Scan(&at, &source, &run.OK, &run.Accounts, &run.Keys, &balance, &held, &problems, &run.ProblemCount, &took)
	if errors.Is(err, sql.ErrNoRows) {
		return run, tollgate.ErrNotFound
	}
	if err == nil {
		err = json.Unmarshal([]byte(problems), &run.Problems)
	}
	if err != nil {
		return run, fmt.Errorf("sqlite: last audit: %w", err)
	}
	run.Time, run.Source, run.Balance, run.Held = fromMicros(at), tollgate.AuditSource(source), tollgate.Amount(balance), tollgate.Amount(held)
	run.Took = time.Duration(took) * time.Microsecond
	if len(run.Problems) == 0 {
		run.Problems = nil
	}
	return run, nil
}

// nonNil is s, or an empty slice for nil (stored as [], not null).
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
