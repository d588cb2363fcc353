-- The runs of the audit of the books (billing.RunAudit), from the CLI, the
-- admin API or the operator console, so that the last result survives
-- restarts and is the same on every instance. Bounded: recording a run
-- deletes those beyond the newest 100, and a run keeps its first 50
-- problems (problem_count counts them all). time is unix microseconds;
-- amounts in picodollars, as in the ledger.

CREATE TABLE audit_runs (
    id            INTEGER PRIMARY KEY,
    time          INTEGER NOT NULL,
    source        TEXT    NOT NULL, -- cli, admin_api or console
    ok            INTEGER NOT NULL CHECK (ok IN (0, 1)),
    accounts      INTEGER NOT NULL,
    keys          INTEGER NOT NULL,
    balance       INTEGER NOT NULL,
    held          INTEGER NOT NULL,
    problems      TEXT    NOT NULL, -- a JSON array of strings
    problem_count INTEGER NOT NULL,
    took_us       INTEGER NOT NULL
) STRICT;

CREATE INDEX audit_runs_time ON audit_runs (time, id);
