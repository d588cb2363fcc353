-- Payments (docs/payments.md): what account holders pay through a payment
-- provider, the provider's events as received, and what accounts owe.
-- Money is BIGINT picodollars, card amounts BIGINT cents.
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

ALTER TABLE ledger DROP CONSTRAINT ledger_kind_check;
ALTER TABLE ledger ADD CONSTRAINT ledger_kind_check CHECK (kind IN ('opening', 'credit', 'debit', 'charge',
    'payment', 'refund', 'dispute', 'dispute_won', 'owed_settled'));

-- owed: what refunds and disputes could not take from the balance.
-- payment_hold: the account was disabled by payments (owed, or a dispute
-- not won); it is enabled again when both are cleared. An operator's
-- enable or disable clears it (the operator's decision wins).
ALTER TABLE accounts ADD COLUMN owed bigint NOT NULL DEFAULT 0 CHECK (owed >= 0),
                     ADD COLUMN payment_hold boolean NOT NULL DEFAULT false;

CREATE TABLE payments (
    id               text        PRIMARY KEY,  -- pay_...
    account_id       text        NOT NULL REFERENCES accounts (id),
    provider         text        NOT NULL,
    kind             text        NOT NULL CHECK (kind IN ('checkout', 'auto_topup')),
    status           text        NOT NULL CHECK (status IN ('pending', 'credited', 'failed', 'refunded', 'disputed')),
    checkout_session text        UNIQUE,
    payment_intent   text        UNIQUE,
    charge           text        NOT NULL DEFAULT '',
    customer         text        NOT NULL DEFAULT '',
    credit           bigint      NOT NULL CHECK (credit > 0),
    fee              bigint      NOT NULL CHECK (fee >= 0),
    amount_cents     bigint      NOT NULL CHECK (amount_cents > 0),
    currency         text        NOT NULL,
    receipt_url      text        NOT NULL DEFAULT '',
    credit_entry     text        UNIQUE,       -- the ledger row of the credit; NULL until credited
    refunded_cents   bigint      NOT NULL DEFAULT 0,
    refunded         bigint      NOT NULL DEFAULT 0, -- credit taken back for refunds
    dispute          text        NOT NULL DEFAULT '',
    dispute_status   text        NOT NULL DEFAULT '', -- open, won, lost
    disputed_cents   bigint      NOT NULL DEFAULT 0,
    disputed         bigint      NOT NULL DEFAULT 0, -- credit taken back for the dispute
    note             text        NOT NULL DEFAULT '',
    created          timestamptz NOT NULL,
    paid             timestamptz,
    credited         timestamptz,
    updated          timestamptz NOT NULL
);

CREATE INDEX payments_account ON payments (account_id, created);

-- The provider's events as received (one row per event id; a redelivery
-- counts in deliveries and keeps the latest outcome).
CREATE TABLE payment_events (
    id         text        PRIMARY KEY,
    type       text        NOT NULL,
    provider   text        NOT NULL,
    object     text        NOT NULL DEFAULT '',
    account_id text        NOT NULL DEFAULT '',
    payment_id text        NOT NULL DEFAULT '',
    outcome    text        NOT NULL,
    problem    boolean     NOT NULL,
    detail     text        NOT NULL DEFAULT '',
    deliveries bigint      NOT NULL,
    first      timestamptz NOT NULL,
    last       timestamptz NOT NULL
);

CREATE INDEX payment_events_last ON payment_events (last);

-- Auto top-up: when an account's free balance falls below threshold,
-- charge its saved card for amount (the credit). in_flight is the payment
-- of the top-up running (at most one per account: a claim is a conditional
-- UPDATE of this row); claimed_until lets a crashed instance's claim lapse.
-- notice says why it was turned off (a declined card).
CREATE TABLE auto_topups (
    account_id     text        PRIMARY KEY REFERENCES accounts (id),
    enabled        boolean     NOT NULL,
    threshold      bigint      NOT NULL CHECK (threshold >= 0),
    amount         bigint      NOT NULL CHECK (amount >= 0),
    customer       text        NOT NULL DEFAULT '',
    payment_method text        NOT NULL DEFAULT '',
    in_flight      text,
    claimed_until  timestamptz,
    notice         text        NOT NULL DEFAULT '',
    updated        timestamptz NOT NULL
);
