-- Payments (docs/payments.md): what account holders pay through a payment
-- provider, the provider's events as received, and what accounts owe.
-- Money is INTEGER picodollars, card amounts INTEGER cents, times INTEGER
-- unix microseconds.
--
-- The ledger gains the payment kinds. SQLite cannot change a CHECK
-- constraint, so the ledger is rebuilt as migration 0005 did (same columns,
-- indexes and trigger).
--
-- Exactly once: a payment's credit is the ledger row 'le_pay_' || payments.id
-- (ledger.id is UNIQUE), and payments.credit_entry names it (UNIQUE too), so
-- a second credit of one payment fails at the store whatever raced it.
--
-- Invariants the audit checks (tollgate audit), besides those of 0002:
--   accounts.owed = sum(ledger.uncollected) of its refund, dispute and
--                   owed_settled rows, and owed >= 0
--   sum(payments.credit) of an account's credited payments
--                 = sum(ledger.amount) of its payment rows

DROP TRIGGER accounts_opening;

CREATE TABLE ledger_rebuilt (
    seq               INTEGER PRIMARY KEY,
    id                TEXT    NOT NULL UNIQUE, -- request id of a charge; le_... otherwise
    kind              TEXT    NOT NULL CHECK (kind IN ('opening', 'credit', 'debit', 'charge',
                                  'payment', 'refund', 'dispute', 'dispute_won', 'owed_settled')),
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
    cost              INTEGER NOT NULL DEFAULT 0, -- charge: the cost at the rates; refund, dispute: the debit asked
    uncollected       INTEGER NOT NULL DEFAULT 0, -- charge: not collected; refund, dispute, owed_settled: change of owed
    estimated         INTEGER NOT NULL DEFAULT 0 CHECK (estimated IN (0, 1)),
    searches          INTEGER NOT NULL DEFAULT 0,
    search_price      INTEGER NOT NULL DEFAULT 0
) STRICT;

INSERT INTO ledger_rebuilt (seq, id, kind, account_id, amount, note, time, hold_id, key_id, model, class, node,
    prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated,
    searches, search_price)
SELECT seq, id, kind, account_id, amount, note, time, hold_id, key_id, model, class, node,
    prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated,
    searches, search_price
FROM ledger ORDER BY seq;

DROP TABLE ledger;
ALTER TABLE ledger_rebuilt RENAME TO ledger;

CREATE INDEX ledger_account_time ON ledger (account_id, time);

CREATE TRIGGER accounts_opening AFTER INSERT ON accounts WHEN NEW.balance <> 0
BEGIN
    INSERT INTO ledger (id, kind, account_id, amount, note, time)
    VALUES ('le_open_' || NEW.id, 'opening', NEW.id, NEW.balance, 'opening balance', NEW.created);
END;

-- owed: what refunds and disputes could not take from the balance.
-- payment_hold: the account was disabled by payments (owed, or a dispute
-- not won); it is enabled again when both are cleared. An operator's
-- enable or disable clears it (the operator's decision wins).
ALTER TABLE accounts ADD COLUMN owed         INTEGER NOT NULL DEFAULT 0 CHECK (owed >= 0);
ALTER TABLE accounts ADD COLUMN payment_hold INTEGER NOT NULL DEFAULT 0 CHECK (payment_hold IN (0, 1));

CREATE TABLE payments (
    id               TEXT    PRIMARY KEY,      -- pay_...
    account_id       TEXT    NOT NULL REFERENCES accounts (id),
    provider         TEXT    NOT NULL,
    kind             TEXT    NOT NULL CHECK (kind IN ('checkout', 'auto_topup')),
    status           TEXT    NOT NULL CHECK (status IN ('pending', 'credited', 'failed', 'refunded', 'disputed')),
    checkout_session TEXT    UNIQUE,
    payment_intent   TEXT    UNIQUE,
    charge           TEXT    NOT NULL DEFAULT '',
    customer         TEXT    NOT NULL DEFAULT '',
    credit           INTEGER NOT NULL CHECK (credit > 0),
    fee              INTEGER NOT NULL CHECK (fee >= 0),
    amount_cents     INTEGER NOT NULL CHECK (amount_cents > 0),
    currency         TEXT    NOT NULL,
    receipt_url      TEXT    NOT NULL DEFAULT '',
    credit_entry     TEXT    UNIQUE,           -- the ledger row of the credit; NULL until credited
    refunded_cents   INTEGER NOT NULL DEFAULT 0,
    refunded         INTEGER NOT NULL DEFAULT 0, -- credit taken back for refunds
    dispute          TEXT    NOT NULL DEFAULT '',
    dispute_status   TEXT    NOT NULL DEFAULT '', -- open, won, lost
    disputed_cents   INTEGER NOT NULL DEFAULT 0,
    disputed         INTEGER NOT NULL DEFAULT 0, -- credit taken back for the dispute
    note             TEXT    NOT NULL DEFAULT '',
    created          INTEGER NOT NULL,
    paid             INTEGER,
    credited         INTEGER,
    updated          INTEGER NOT NULL
) STRICT;

CREATE INDEX payments_account ON payments (account_id, created);

-- The provider's events as received (one row per event id; a redelivery
-- counts in deliveries and keeps the latest outcome).
CREATE TABLE payment_events (
    id         TEXT    PRIMARY KEY,
    type       TEXT    NOT NULL,
    provider   TEXT    NOT NULL,
    object     TEXT    NOT NULL DEFAULT '',
    account_id TEXT    NOT NULL DEFAULT '',
    payment_id TEXT    NOT NULL DEFAULT '',
    outcome    TEXT    NOT NULL,
    problem    INTEGER NOT NULL CHECK (problem IN (0, 1)),
    detail     TEXT    NOT NULL DEFAULT '',
    deliveries INTEGER NOT NULL,
    first      INTEGER NOT NULL,
    last       INTEGER NOT NULL
) STRICT;

CREATE INDEX payment_events_last ON payment_events (last);

-- Auto top-up: when an account's free balance falls below threshold,
-- charge its saved card for amount (the credit). in_flight is the payment
-- of the top-up running (at most one per account: a claim is a conditional
-- UPDATE of this row); claimed_until lets a crashed instance's claim lapse.
-- notice says why it was turned off (a declined card).
CREATE TABLE auto_topups (
    account_id     TEXT    PRIMARY KEY REFERENCES accounts (id),
    enabled        INTEGER NOT NULL CHECK (enabled IN (0, 1)),
    threshold      INTEGER NOT NULL CHECK (threshold >= 0),
    amount         INTEGER NOT NULL CHECK (amount >= 0),
    customer       TEXT    NOT NULL DEFAULT '',
    payment_method TEXT    NOT NULL DEFAULT '',
    in_flight      TEXT,
    claimed_until  INTEGER,
    notice         TEXT    NOT NULL DEFAULT '',
    updated        INTEGER NOT NULL
) STRICT;
