-- Accounts, API keys, the auth change counter and the hourly traffic buckets.
-- Money is BIGINT picodollars (1e-12 USD), tollgate.Amount as is: an int64
-- holds +-9.2 million USD exactly, and conditional updates such as
-- "balance - held >= $1" stay plain integer comparisons.

CREATE TABLE accounts (
    id       text        PRIMARY KEY,
    name     text        NOT NULL,
    created  timestamptz NOT NULL,
    disabled boolean     NOT NULL DEFAULT false,
    balance  bigint      NOT NULL DEFAULT 0
);

CREATE TABLE api_keys (
    id             text        PRIMARY KEY,
    account_id     text        NOT NULL REFERENCES accounts (id),
    name           text        NOT NULL DEFAULT '',
    prefix         text        NOT NULL,
    hash           text        NOT NULL UNIQUE, -- hex SHA-256 of the secret
    created        timestamptz NOT NULL,
    expires        timestamptz,                 -- NULL: never
    revoked        timestamptz,                 -- NULL: active
    allowed_models text[]      NOT NULL DEFAULT '{}' -- empty = all models
);

CREATE INDEX api_keys_account_id ON api_keys (account_id);

-- One row; version grows in the same transaction as every key create/revoke
-- and account disable/enable, so a cache that sees a new version also sees the change.
CREATE TABLE auth_version (
    id      integer PRIMARY KEY CHECK (id = 1),
    version bigint  NOT NULL
);

INSERT INTO auth_version (id, version) VALUES (1, 0);

CREATE TABLE traffic (
    hour     timestamptz NOT NULL,
    class    text        NOT NULL,
    requests bigint      NOT NULL,
    PRIMARY KEY (hour, class)
);
