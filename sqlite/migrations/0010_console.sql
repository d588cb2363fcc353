-- The console (docs/console.md): invitations the operator issues, account
-- holders' passwords and their sign-in sessions. Tokens are stored as the
-- hex SHA-256 of the secret, passwords as argon2id strings (console/password.go).

CREATE TABLE console_passwords (
    account_id TEXT    PRIMARY KEY REFERENCES accounts (id),
    hash       TEXT    NOT NULL, -- $argon2id$v=19$m=...,t=...,p=...$salt$key
    updated    INTEGER NOT NULL
) STRICT;

CREATE TABLE console_invites (
    hash       TEXT    PRIMARY KEY,
    account_id TEXT    NOT NULL REFERENCES accounts (id),
    created    INTEGER NOT NULL,
    expires    INTEGER NOT NULL,
    used       INTEGER           -- NULL: not used yet
) STRICT;

CREATE TABLE console_sessions (
    hash           TEXT    PRIMARY KEY,
    account_id     TEXT    NOT NULL REFERENCES accounts (id),
    created        INTEGER NOT NULL,
    expires        INTEGER NOT NULL,
    playground_key TEXT    NOT NULL DEFAULT ''
) STRICT;

CREATE INDEX console_sessions_account ON console_sessions (account_id, expires);
