-- The console (docs/console.md): invitations the operator issues, account
-- holders' passwords and their sign-in sessions. Tokens are stored as the
-- hex SHA-256 of the secret, passwords as argon2id strings (console/password.go).

CREATE TABLE console_passwords (
    account_id text        PRIMARY KEY REFERENCES accounts (id),
    hash       text        NOT NULL, -- $argon2id$v=19$m=...,t=...,p=...$salt$key
    updated    timestamptz NOT NULL
);

CREATE TABLE console_invites (
    hash       text        PRIMARY KEY,
    account_id text        NOT NULL REFERENCES accounts (id),
    created    timestamptz NOT NULL,
    expires    timestamptz NOT NULL,
    used       timestamptz           -- NULL: not used yet
);

CREATE TABLE console_sessions (
    hash           text        PRIMARY KEY,
    account_id     text        NOT NULL REFERENCES accounts (id),
    created        timestamptz NOT NULL,
    expires        timestamptz NOT NULL,
    playground_key text        NOT NULL DEFAULT ''
);

CREATE INDEX console_sessions_account ON console_sessions (account_id, expires);
