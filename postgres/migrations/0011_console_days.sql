-- The console's sums of an account's closed days (console/daycache.go): a
-- cache derived from the ledger, so that an instance that has just started
-- reads about 30 days of sums instead of summing the ledger's rows. Each day
-- is saved with the mark (rows, highest seq) of the ledger rows it was summed
-- at; a day whose mark has changed since is summed again. Deleting rows (or
-- all of them) is always safe. A day with rows but no charge has a mark and
-- no sums. Amounts in picodollars, as in the ledger.

CREATE TABLE console_days (
    account_id  text   NOT NULL REFERENCES accounts (id),
    day         date   NOT NULL, -- UTC
    ledger_rows bigint NOT NULL, -- the day's ledger rows of the account, of any kind
    last_seq    bigint NOT NULL, -- the highest seq among them
    PRIMARY KEY (account_id, day)
);

CREATE TABLE console_day_sums (
    account_id        text   NOT NULL,
    day               date   NOT NULL,
    key_id            text   NOT NULL,
    model             text   NOT NULL,
    class             text   NOT NULL,
    requests          bigint NOT NULL,
    prompt_tokens     bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    cached_tokens     bigint NOT NULL,
    reasoning_tokens  bigint NOT NULL,
    estimated         bigint NOT NULL,
    searches          bigint NOT NULL,
    cost              bigint NOT NULL,
    uncollected       bigint NOT NULL,
    PRIMARY KEY (account_id, day, key_id, model, class),
    FOREIGN KEY (account_id, day) REFERENCES console_days (account_id, day) ON DELETE CASCADE
);
