-- Web search fees on a charge (docs/billing.md, "Web search fees"): the
-- number of searches that ran for the request and the price of one, in
-- picodollars. A charge's cost is prompt × input + completion × output +
-- searches × search_price; amount stays −(cost − uncollected), so the audit,
-- which sums amounts, is unchanged. Rows written before this migration (and
-- every row that is not a charge) read as no search. ADD COLUMN with a
-- constant default rewrites nothing (PostgreSQL 11 and later).
ALTER TABLE ledger ADD COLUMN searches bigint NOT NULL DEFAULT 0,
                   ADD COLUMN search_price bigint NOT NULL DEFAULT 0;

-- tollgate_settle and tollgate_charge with the two search arguments. They
-- are new overloads (two more arguments), not replacements: instances of the
-- previous version that run during a rolling upgrade keep calling the old
-- signatures, which still work and write rows with no search (what they
-- served). A later migration drops the old signatures (docs/store.md,
-- "Upgrades").

CREATE FUNCTION tollgate_settle(p_hold text, p_id text, p_account text, p_key text, p_model text, p_class text,
    p_node text, p_prompt bigint, p_completion bigint, p_cached bigint, p_reasoning bigint,
    p_in_rate bigint, p_out_rate bigint, p_cost bigint, p_estimated boolean, p_time timestamptz,
    p_searches bigint, p_search_price bigint,
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
        prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated,
        searches, search_price)
    VALUES (p_id, 'charge', v_acct, -charged, p_time, p_hold, v_key, p_model, p_class, p_node,
        p_prompt, p_completion, p_cached, p_reasoning, p_in_rate, p_out_rate, p_cost, uncollected, p_estimated,
        p_searches, p_search_price);
END $$;

CREATE FUNCTION tollgate_charge(p_hold text, p_rsv text, p_id text, p_account text, p_key text, p_model text,
    p_class text, p_node text, p_prompt bigint, p_completion bigint, p_cached bigint, p_reasoning bigint,
    p_in_rate bigint, p_out_rate bigint, p_cost bigint, p_covered bigint, p_return bigint, p_estimated boolean,
    p_time timestamptz, p_searches bigint, p_search_price bigint,
    OUT charged bigint, OUT uncollected bigint, OUT replayed boolean, OUT gone boolean)
LANGUAGE plpgsql AS $$
DECLARE
    a_balance bigint; a_held bigint; v_covered bigint := p_covered; v_taken bigint := p_covered + p_return;
BEGIN
    replayed := false; gone := false;
    SELECT balance, held INTO a_balance, a_held FROM accounts WHERE id = p_account FOR UPDATE;
    IF NOT FOUND THEN RAISE EXCEPTION 'charge %: no account %', p_hold, p_account; END IF;
    SELECT -l.amount, l.uncollected INTO charged, uncollected FROM ledger l WHERE l.hold_id = p_hold;
    IF FOUND THEN replayed := true; RETURN; END IF;
    UPDATE holds SET amount = amount - v_taken WHERE id = p_rsv AND request_id = '';
    IF NOT FOUND THEN gone := true; v_covered := 0; v_taken := 0; END IF;
    charged := least(p_cost, greatest(a_balance - a_held + v_covered, 0));
    uncollected := p_cost - charged;
    UPDATE accounts SET balance = balance - charged, held = held - v_taken WHERE id = p_account;
    UPDATE api_keys SET spent = spent + charged, held = held - v_taken WHERE id = p_key;
    INSERT INTO ledger (id, kind, account_id, amount, time, hold_id, key_id, model, class, node,
        prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated,
        searches, search_price)
    VALUES (p_id, 'charge', p_account, -charged, p_time, p_hold, p_key, p_model, p_class, p_node,
        p_prompt, p_completion, p_cached, p_reasoning, p_in_rate, p_out_rate, p_cost, uncollected, p_estimated,
        p_searches, p_search_price);
END $$;
