-- The console's sums of an account's closed days (console/daycache.go): a
-- cache derived from the ledger, so that an instance that has just started
-- reads about 30 days of sums instead of summing the ledger's rows. Each day
-- is saved with the mark (rows, highest seq) of the ledger rows it was summed
-- at; a day whose mark has changed since is summed again. Deleting rows (or
-- all of them) is always safe. A day with rows but no charge has a mark and
-- no sums. day is the UTC midnight in unix microseconds; amounts in
-- picodollars, as in the ledger.

CREATE TABLE console_days (
    account_id  TEXT    NOT NULL REFERENCES accounts (id),
    day         INTEGER NOT NULL,
    ledger_rows INTEGER NOT NULL, -- the day's ledger rows of the account, of any kind
    last_seq    INTEGER NOT NULL, -- the highest seq among them
    PRIMARY KEY (account_id, day)
) STRICT, WITHOUT ROWID;

CREATE TABLE console_day_sums (
    account_id        TEXT    NOT NULL,
    day               INTEGER NOT NULL,
    key_id            TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    class             TEXT    NOT NULL,
    requests          INTEGER NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cached_tokens     INTEGER NOT NULL,
    reasoning_tokens  INTEGER NOT NULL,
    estimated         INTEGER NOT NULL,
    searches          INTEGER NOT NULL,
    cost              INTEGER NOT NULL,
    uncollected       INTEGER NOT NULL,
    PRIMARY KEY (account_id, day, key_id, model, class),
    FOREIGN KEY (account_id, day) REFERENCES console_days (account_id, day) ON DELETE CASCADE
) STRICT, WITHOUT ROWID;
