-- Accounts, API keys, the auth change counter and the hourly traffic buckets.
-- Times are INTEGER unix microseconds (UTC), matching PostgreSQL's timestamptz
-- precision; traffic hours are INTEGER unix seconds of the hour's start.
-- Money is INTEGER picodollars (1e-12 USD), tollgate.Amount as is.

CREATE TABLE accounts (
    id       TEXT    PRIMARY KEY,
    name     TEXT    NOT NULL,
    created  INTEGER NOT NULL,
    disabled INTEGER NOT NULL DEFAULT 0 CHECK (disabled IN (0, 1)),
    balance  INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE api_keys (
    id             TEXT    PRIMARY KEY,
    account_id     TEXT    NOT NULL REFERENCES accounts (id),
    name           TEXT    NOT NULL DEFAULT '',
    prefix         TEXT    NOT NULL,
    hash           TEXT    NOT NULL UNIQUE, -- hex SHA-256 of the secret
    created        INTEGER NOT NULL,
    expires        INTEGER,                 -- NULL: never
    revoked        INTEGER,                 -- NULL: active
    allowed_models TEXT    NOT NULL DEFAULT '[]' -- JSON array of model ids; [] = all
) STRICT;

CREATE INDEX api_keys_account_id ON api_keys (account_id);

-- One row; version grows in the same transaction as every key create/revoke
-- and account disable/enable, so a cache that sees a new version also sees the change.
CREATE TABLE auth_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
) STRICT;

INSERT INTO auth_version (id, version) VALUES (1, 0);

CREATE TABLE traffic (
    hour     INTEGER NOT NULL,
    class    TEXT    NOT NULL,
    requests INTEGER NOT NULL,
    PRIMARY KEY (hour, class)
) STRICT, WITHOUT ROWID;
