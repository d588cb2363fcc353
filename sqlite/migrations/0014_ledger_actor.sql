-- Who made each of the ledger's operator entries, which the operator's
-- console lists on an account's page (docs/console.md): "the operator
-- console from 203.0.113.7", "the CLI as alice@host", "the admin API from
-- 10.0.0.2". Empty for charges and for entries made before this column.
--
-- The index covers the entries that are not charges, so that page reads
-- them without walking the account's charges; a charge's insert (the write
-- every request makes) does not touch it.
--
-- console_secret is the one key the console signs its sign-in and
-- invitation forms' tokens with (console/auth.go), the same on every
-- instance; it is made on first use.

ALTER TABLE ledger ADD COLUMN actor TEXT NOT NULL DEFAULT '';

CREATE INDEX ledger_account_entries ON ledger (account_id, seq) WHERE kind <> 'charge';

CREATE TABLE console_secret (
    id     INTEGER PRIMARY KEY CHECK (id = 1),
    secret BLOB    NOT NULL
) STRICT;
