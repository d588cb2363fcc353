-- Billing: holds, the ledger, key limits and per-key rate windows
-- (docs/billing.md). Money is BIGINT picodollars.
--
-- Invariants the audit checks (tollgate audit):
--   accounts.balance = sum(ledger.amount) of the account
--   accounts.held    = sum(holds.amount) of the account, and held <= balance
--   api_keys.spent   = -sum(ledger.amount) of the key's charges
--   api_keys.held    = sum(holds.amount) of the key

ALTER TABLE accounts ADD COLUMN held bigint NOT NULL DEFAULT 0;

ALTER TABLE api_keys ADD COLUMN spend_limit bigint NOT NULL DEFAULT 0; -- 0: none
ALTER TABLE api_keys ADD COLUMN rpm         bigint NOT NULL DEFAULT 0; -- 0: none
ALTER TABLE api_keys ADD COLUMN tpm         bigint NOT NULL DEFAULT 0; -- 0: none
ALTER TABLE api_keys ADD COLUMN spent       bigint NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN held        bigint NOT NULL DEFAULT 0;

-- Active holds only: a settle or a release deletes the row (the ledger keeps
-- the hold id of a charge, which makes a retried settle idempotent).
CREATE TABLE holds (
    id         text        PRIMARY KEY,
    request_id text        NOT NULL,
    account_id text        NOT NULL REFERENCES accounts (id),
    key_id     text        NOT NULL REFERENCES api_keys (id),
    model      text        NOT NULL,
    class      text        NOT NULL,
    amount     bigint      NOT NULL CHECK (amount >= 0),
    tokens     bigint      NOT NULL DEFAULT 0,
    minute     bigint      NOT NULL DEFAULT 0, -- unix minute of the rate window counted in; 0: none
    owner      text        NOT NULL,           -- instance id; it renews the lease while alive
    created    timestamptz NOT NULL,
    expires    timestamptz NOT NULL
);

CREATE INDEX holds_expires ON holds (expires);
CREATE INDEX holds_owner ON holds (owner);

CREATE TABLE ledger (
    seq               bigserial   PRIMARY KEY,
    id                text        NOT NULL UNIQUE, -- request id of a charge; le_... otherwise
    kind              text        NOT NULL CHECK (kind IN ('opening', 'credit', 'debit', 'charge')),
    account_id        text        NOT NULL REFERENCES accounts (id),
    amount            bigint      NOT NULL,        -- signed change of the balance
    note              text        NOT NULL DEFAULT '',
    time              timestamptz NOT NULL,
    hold_id           text        UNIQUE,          -- charges only
    key_id            text,
    model             text,
    class             text,
    node              text,
    prompt_tokens     bigint      NOT NULL DEFAULT 0,
    completion_tokens bigint      NOT NULL DEFAULT 0,
    cached_tokens     bigint      NOT NULL DEFAULT 0,
    reasoning_tokens  bigint      NOT NULL DEFAULT 0,
    input_rate        bigint      NOT NULL DEFAULT 0, -- tollgate.Rate: micro-USD per 1M tokens
    output_rate       bigint      NOT NULL DEFAULT 0,
    cost              bigint      NOT NULL DEFAULT 0, -- the cost at the rates; amount = -(cost - uncollected)
    uncollected       bigint      NOT NULL DEFAULT 0,
    estimated         boolean     NOT NULL DEFAULT false
);

CREATE INDEX ledger_account_time ON ledger (account_id, time);
CREATE INDEX ledger_time ON ledger (time);
CREATE INDEX ledger_key ON ledger (key_id);

-- Requests and tokens of a key in one minute (fixed windows, shared by every
-- instance on the database).
CREATE TABLE key_windows (
    key_id   text   NOT NULL,
    minute   bigint NOT NULL, -- unix minute
    requests bigint NOT NULL,
    tokens   bigint NOT NULL,
    PRIMARY KEY (key_id, minute)
);

-- Balances that existed before this migration become opening entries.
INSERT INTO ledger (id, kind, account_id, amount, note, time)
SELECT 'le_open_' || id, 'opening', id, balance, 'balance before the ledger existed', created
FROM accounts WHERE balance <> 0;

-- An account created with a balance gets its opening entry in the same
-- statement, whoever creates it.
CREATE FUNCTION tollgate_accounts_opening() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ledger (id, kind, account_id, amount, note, time)
    VALUES ('le_open_' || NEW.id, 'opening', NEW.id, NEW.balance, 'opening balance', NEW.created);
    RETURN NULL;
END $$;

CREATE TRIGGER accounts_opening AFTER INSERT ON accounts
FOR EACH ROW WHEN (NEW.balance <> 0) EXECUTE FUNCTION tollgate_accounts_opening();

-- The three billing operations, one round trip each. Lock order everywhere:
-- the account row first, then the hold, the key and its rate window. Batches
-- are applied in account order, so transactions of several instances never
-- wait on each other in a cycle.

-- tollgate_hold places a hold if the account's free balance, the key's spend
-- limit and the key's rate window allow it. outcome: 0 placed, 1 insufficient
-- balance (free = free balance), 2 key spend limit (free = what the key may
-- still spend), 3 rate limited (retry_minute = the window that frees up),
-- 4 no such account or key.
CREATE FUNCTION tollgate_hold(p_id text, p_request text, p_account text, p_key text, p_model text, p_class text,
    p_amount bigint, p_tokens bigint, p_minute bigint, p_owner text, p_created timestamptz, p_expires timestamptz,
    OUT outcome int, OUT free bigint, OUT retry_minute bigint)
LANGUAGE plpgsql AS $$
DECLARE
    a_balance bigint; a_held bigint;
    k_limit bigint; k_spent bigint; k_held bigint; k_rpm bigint; k_tpm bigint;
    w_req bigint; w_tok bigint; v_minute bigint := 0;
BEGIN
    outcome := 0; free := 0; retry_minute := 0;
    SELECT balance, held INTO a_balance, a_held FROM accounts WHERE id = p_account FOR UPDATE;
    IF NOT FOUND THEN outcome := 4; RETURN; END IF;
    IF a_balance - a_held < p_amount THEN outcome := 1; free := a_balance - a_held; RETURN; END IF;
    SELECT spend_limit, spent, held, rpm, tpm INTO k_limit, k_spent, k_held, k_rpm, k_tpm
    FROM api_keys WHERE id = p_key AND account_id = p_account FOR UPDATE;
    IF NOT FOUND THEN outcome := 4; RETURN; END IF;
    IF k_limit > 0 AND k_spent + k_held + p_amount > k_limit THEN
        outcome := 2; free := greatest(k_limit - k_spent - k_held, 0); RETURN;
    END IF;
    IF k_rpm > 0 OR k_tpm > 0 THEN
        v_minute := p_minute;
        SELECT requests, tokens INTO w_req, w_tok FROM key_windows WHERE key_id = p_key AND minute = v_minute;
        IF NOT FOUND THEN w_req := 0; w_tok := 0; END IF;
        IF (k_rpm > 0 AND w_req + 1 > k_rpm) OR (k_tpm > 0 AND w_tok >= k_tpm) THEN
            outcome := 3; retry_minute := v_minute + 1; RETURN;
        END IF;
        INSERT INTO key_windows (key_id, minute, requests, tokens) VALUES (p_key, v_minute, 1, p_tokens)
        ON CONFLICT (key_id, minute) DO UPDATE
            SET requests = key_windows.requests + 1, tokens = key_windows.tokens + excluded.tokens;
    END IF;
    UPDATE accounts SET held = held + p_amount WHERE id = p_account;
    UPDATE api_keys SET held = held + p_amount WHERE id = p_key;
    INSERT INTO holds (id, request_id, account_id, key_id, model, class, amount, tokens, minute, owner, created, expires)
    VALUES (p_id, p_request, p_account, p_key, p_model, p_class, p_amount, p_tokens, v_minute, p_owner, p_created, p_expires);
END $$;

-- tollgate_settle charges a request and frees its hold, writing the ledger
-- row. The charge is min(cost, free balance + the hold): never below zero,
-- never from other requests' holds; the rest is recorded as uncollected. A
-- hold already settled returns its charge (replayed); a hold that is gone
-- (swept after its lease) is charged from the free balance alone.
CREATE FUNCTION tollgate_settle(p_hold text, p_id text, p_account text, p_key text, p_model text, p_class text,
    p_node text, p_prompt bigint, p_completion bigint, p_cached bigint, p_reasoning bigint,
    p_in_rate bigint, p_out_rate bigint, p_cost bigint, p_estimated boolean, p_time timestamptz,
    OUT charged bigint, OUT uncollected bigint, OUT replayed boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_acct text; v_key text; v_amount bigint; v_tokens bigint; v_minute bigint;
    a_balance bigint; a_held bigint;
BEGIN
    replayed := false;
    SELECT -l.amount, l.uncollected INTO charged, uncollected FROM ledger l WHERE l.hold_id = p_hold;
    IF FOUND THEN replayed := true; RETURN; END IF;
    SELECT account_id INTO v_acct FROM holds WHERE id = p_hold;
    IF NOT FOUND THEN v_acct := p_account; END IF;
    SELECT balance, held INTO a_balance, a_held FROM accounts WHERE id = v_acct FOR UPDATE;
    IF NOT FOUND THEN RAISE EXCEPTION 'settle %: no account %', p_hold, v_acct; END IF;
    -- Under the lock: a concurrent settle of the same hold has committed or not begun.
    SELECT -l.amount, l.uncollected INTO charged, uncollected FROM ledger l WHERE l.hold_id = p_hold;
    IF FOUND THEN replayed := true; RETURN; END IF;
    DELETE FROM holds WHERE id = p_hold RETURNING key_id, amount, tokens, minute INTO v_key, v_amount, v_tokens, v_minute;
    IF NOT FOUND THEN v_key := p_key; v_amount := 0; v_tokens := 0; v_minute := 0; END IF;
    charged := least(p_cost, greatest(a_balance - a_held + v_amount, 0));
    uncollected := p_cost - charged;
    UPDATE accounts SET balance = balance - charged, held = held - v_amount WHERE id = v_acct;
    UPDATE api_keys SET spent = spent + charged, held = held - v_amount WHERE id = v_key;
    IF v_minute <> 0 AND v_tokens > p_prompt + p_completion THEN
        UPDATE key_windows SET tokens = greatest(tokens - (v_tokens - p_prompt - p_completion), 0)
        WHERE key_id = v_key AND minute = v_minute;
    END IF;
    INSERT INTO ledger (id, kind, account_id, amount, time, hold_id, key_id, model, class, node,
        prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated)
    VALUES (p_id, 'charge', v_acct, -charged, p_time, p_hold, v_key, p_model, p_class, p_node,
        p_prompt, p_completion, p_cached, p_reasoning, p_in_rate, p_out_rate, p_cost, uncollected, p_estimated);
END $$;

-- tollgate_release frees a hold without a charge; false if there was none.
CREATE FUNCTION tollgate_release(p_hold text, OUT released boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_acct text; v_key text; v_amount bigint; v_tokens bigint; v_minute bigint;
BEGIN
    released := false;
    SELECT account_id INTO v_acct FROM holds WHERE id = p_hold;
    IF NOT FOUND THEN RETURN; END IF;
    PERFORM 1 FROM accounts WHERE id = v_acct FOR UPDATE;
    DELETE FROM holds WHERE id = p_hold RETURNING key_id, amount, tokens, minute INTO v_key, v_amount, v_tokens, v_minute;
    IF NOT FOUND THEN RETURN; END IF;
    UPDATE accounts SET held = held - v_amount WHERE id = v_acct;
    UPDATE api_keys SET held = held - v_amount WHERE id = v_key;
    IF v_minute <> 0 AND v_tokens > 0 THEN
        UPDATE key_windows SET tokens = greatest(tokens - v_tokens, 0) WHERE key_id = v_key AND minute = v_minute;
    END IF;
    released := true;
END $$;
