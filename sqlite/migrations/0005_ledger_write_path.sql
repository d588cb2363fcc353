-- The ledger, rebuilt for its write path (docs/billing.md, "The charge's
-- write path"). A charge row is the one database write every request makes,
-- so every index the table keeps is paid on every request:
--
--   * seq is the rowid without AUTOINCREMENT. Ledger rows are never deleted,
--     so rowids still only grow (SQLite takes max(rowid) + 1), and no
--     sqlite_sequence row is rewritten per insert.
--   * No index on time alone nor on key_id. A query by period without an
--     account goes through ledger_account_time account by account, and a
--     query by key through the key's account (a key belongs to one); the
--     audit sums the keys' charges in one grouped scan (sqlite/billing.go).
--
-- Columns and the opening-balance trigger are unchanged. Hold ids are now
-- made in time order (tollgate.NewOrderedID), so that the UNIQUE index on
-- hold_id grows at its right edge like the others.

DROP TRIGGER accounts_opening;

CREATE TABLE ledger_rebuilt (
    seq               INTEGER PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE, -- request id of a charge; le_... otherwise
    kind              TEXT    NOT NULL CHECK (kind IN ('opening', 'credit', 'debit', 'charge')),
    account_id        TEXT    NOT NULL REFERENCES accounts (id),
    amount            INTEGER NOT NULL,        -- signed change of the balance
    note              TEXT    NOT NULL DEFAULT '',
    time              INTEGER NOT NULL,
    hold_id           TEXT    UNIQUE,          -- charges only
    key_id            TEXT,
    model             TEXT,
    class             TEXT,
    node              TEXT,
    prompt_tokens     INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens     INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens  INTEGER NOT NULL DEFAULT 0,
    input_rate        INTEGER NOT NULL DEFAULT 0, -- tollgate.Rate: micro-USD per 1M tokens
    output_rate       INTEGER NOT NULL DEFAULT 0,
    cost              INTEGER NOT NULL DEFAULT 0, -- the cost at the rates; amount = -(cost - uncollected)
    uncollected       INTEGER NOT NULL DEFAULT 0,
    estimated         INTEGER NOT NULL DEFAULT 0 CHECK (estimated IN (0, 1))
) STRICT;

INSERT INTO ledger_rebuilt (seq, id, kind, account_id, amount, note, time, hold_id, key_id, model, class, node,
    prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated)
SELECT seq, id, kind, account_id, amount, note, time, hold_id, key_id, model, class, node,
    prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated
FROM ledger ORDER BY seq;

DROP TABLE ledger;
ALTER TABLE ledger_rebuilt RENAME TO ledger;

CREATE INDEX ledger_account_time ON ledger (account_id, time);

CREATE TRIGGER accounts_opening AFTER INSERT ON accounts WHEN NEW.balance <> 0
BEGIN
    INSERT INTO ledger (id, kind, account_id, amount, note, time)
    VALUES ('le_open_' || NEW.id, 'opening', NEW.id, NEW.balance, 'opening balance', NEW.created);
END;
