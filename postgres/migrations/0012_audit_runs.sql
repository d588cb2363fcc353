-- The runs of the audit of the books (billing.RunAudit), from the CLI, the
-- admin API or the operator console, so that the last result survives
-- restarts and is the same on every instance. Bounded: recording a run
-- deletes those beyond the newest 100, and a run keeps its first 50
-- problems (problem_count counts them all). Amounts in picodollars, as in
-- the ledger.

CREATE TABLE audit_runs (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time          timestamptz NOT NULL,
    source        text        NOT NULL, -- cli, admin_api or console
    ok            boolean     NOT NULL,
    accounts      bigint      NOT NULL,
    keys          bigint      NOT NULL,
    balance       bigint      NOT NULL,
    held          bigint      NOT NULL,
    problems      text[]      NOT NULL,
    problem_count bigint      NOT NULL,
    took_us       bigint      NOT NULL
);

CREATE INDEX audit_runs_time ON audit_runs (time, id);
