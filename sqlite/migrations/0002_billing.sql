-- Billing: holds, the ledger, key limits and per-key rate windows
-- (docs/billing.md). Money is INTEGER picodollars, times INTEGER unix microseconds.
--
-- Invariants the audit checks (tollgate audit):
--   accounts.balance = sum(ledger.amount) of the account
--   accounts.held    = sum(holds.amount) of the account, and held <= balance
--   api_keys.spent   = -sum(ledger.amount) of the key's charges
--   api_keys.held    = sum(holds.amount) of the key

ALTER TABLE accounts ADD COLUMN held INTEGER NOT NULL DEFAULT 0;

ALTER TABLE api_keys ADD COLUMN spend_limit INTEGER NOT NULL DEFAULT 0; -- 0: none
ALTER TABLE api_keys ADD COLUMN rpm         INTEGER NOT NULL DEFAULT 0; -- 0: none
ALTER TABLE api_keys ADD COLUMN tpm         INTEGER NOT NULL DEFAULT 0; -- 0: none
ALTER TABLE api_keys ADD COLUMN spent       INTEGER NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN held        INTEGER NOT NULL DEFAULT 0;

-- Active holds only: a settle or a release deletes the row (the ledger keeps
-- the hold id of a charge, which makes a retried settle idempotent).
CREATE TABLE holds (
    id         TEXT    PRIMARY KEY,
    request_id TEXT    NOT NULL,
    account_id TEXT    NOT NULL REFERENCES accounts (id),
    key_id     TEXT    NOT NULL REFERENCES api_keys (id),
    model      TEXT    NOT NULL,
    class      TEXT    NOT NULL,
    amount     INTEGER NOT NULL CHECK (amount >= 0),
    tokens     INTEGER NOT NULL DEFAULT 0,
    minute     INTEGER NOT NULL DEFAULT 0, -- unix minute of the rate window counted in; 0: none
    owner      TEXT    NOT NULL,           -- instance id; it renews the lease while alive
    created    INTEGER NOT NULL,
    expires    INTEGER NOT NULL
) STRICT;

CREATE INDEX holds_expires ON holds (expires);
CREATE INDEX holds_owner ON holds (owner);

CREATE TABLE ledger (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
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

CREATE INDEX ledger_account_time ON ledger (account_id, time);
CREATE INDEX ledger_time ON ledger (time);
CREATE INDEX ledger_key ON ledger (key_id);

-- Requests and tokens of a key in one minute (fixed windows, shared by every
-- process on the database).
CREATE TABLE key_windows (
    key_id   TEXT    NOT NULL,
    minute   INTEGER NOT NULL, -- unix minute
    requests INTEGER NOT NULL,
    tokens   INTEGER NOT NULL,
    PRIMARY KEY (key_id, minute)
) STRICT, WITHOUT ROWID;

-- Balances that existed before this migration become opening entries, so
-- that balance = sum(ledger) holds from now on.
INSERT INTO ledger (id, kind, account_id, amount, note, time)
SELECT 'le_open_' || id, 'opening', id, balance, 'balance before the ledger existed', created
FROM accounts WHERE balance <> 0;

-- An account created with a balance gets its opening entry in the same
-- statement, whoever creates it.
CREATE TRIGGER accounts_opening AFTER INSERT ON accounts WHEN NEW.balance <> 0
BEGIN
    INSERT INTO ledger (id, kind, account_id, amount, note, time)
    VALUES ('le_open_' || NEW.id, 'opening', NEW.id, NEW.balance, 'opening balance', NEW.created);
END;
