-- Per-instance reservations (docs/billing.md, "Reservations"): an instance
-- reserves a slice of an account's free balance as a holds row with no
-- request (request_id = ''), owned and renewed like any hold, counted in
-- accounts.held and api_keys.held, and places its requests' holds against it
-- in memory. Lock order as everywhere: the account row first.

-- tollgate_reserve grows (or, p_create, inserts) reservation p_id by up to
-- p_want: no more than free / p_fraction, nothing if that is below p_need or
-- the free balance below p_min_free (outcome 1, free = the free balance).
-- outcome 5: the key has a spend or rate limit (its requests take the
-- per-request path); 4: no such account or key. gone: the row to grow does
-- not exist (swept).
CREATE FUNCTION tollgate_reserve(p_id text, p_account text, p_key text, p_owner text, p_created timestamptz,
    p_expires timestamptz, p_want bigint, p_need bigint, p_min_free bigint, p_fraction bigint, p_create boolean,
    OUT outcome int, OUT free bigint, OUT granted bigint, OUT gone boolean)
LANGUAGE plpgsql AS $$
DECLARE
    a_balance bigint; a_held bigint; k_limit bigint; k_rpm bigint; k_tpm bigint;
BEGIN
    outcome := 0; free := 0; granted := 0; gone := false;
    SELECT balance, held INTO a_balance, a_held FROM accounts WHERE id = p_account FOR UPDATE;
    IF NOT FOUND THEN outcome := 4; RETURN; END IF;
    SELECT spend_limit, rpm, tpm INTO k_limit, k_rpm, k_tpm FROM api_keys WHERE id = p_key AND account_id = p_account FOR UPDATE;
    IF NOT FOUND THEN outcome := 4; RETURN; END IF;
    IF k_limit > 0 OR k_rpm > 0 OR k_tpm > 0 THEN outcome := 5; RETURN; END IF;
    free := a_balance - a_held;
    granted := least(p_want, free / greatest(p_fraction, 1));
    IF free < p_min_free OR granted < p_need OR granted <= 0 THEN outcome := 1; granted := 0; RETURN; END IF;
    IF p_create THEN
        INSERT INTO holds (id, request_id, account_id, key_id, model, class, amount, tokens, minute, owner, created, expires)
        VALUES (p_id, '', p_account, p_key, '', '', granted, 0, 0, p_owner, p_created, p_expires);
    ELSE
        UPDATE holds SET amount = amount + granted, expires = greatest(expires, p_expires) WHERE id = p_id AND request_id = '';
        IF NOT FOUND THEN outcome := 1; granted := 0; gone := true; RETURN; END IF;
    END IF;
    UPDATE accounts SET held = held + granted WHERE id = p_account;
    UPDATE api_keys SET held = held + granted WHERE id = p_key;
    free := 0;
END $$;

-- tollgate_return gives p_amount of reservation p_rsv back to the free
-- balance and deletes the row once it is empty; gone if there is no such row.
CREATE FUNCTION tollgate_return(p_rsv text, p_account text, p_amount bigint, OUT gone boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
BEGIN
    gone := false;
    PERFORM 1 FROM accounts WHERE id = p_account FOR UPDATE;
    UPDATE holds SET amount = amount - p_amount WHERE id = p_rsv AND request_id = '' RETURNING key_id INTO v_key;
    IF NOT FOUND THEN gone := true; RETURN; END IF;
    UPDATE accounts SET held = held - p_amount WHERE id = p_account;
    UPDATE api_keys SET held = held - p_amount WHERE id = v_key;
    DELETE FROM holds WHERE id = p_rsv AND request_id = '' AND amount = 0;
END $$;

-- tollgate_take moves what a batch of charges took from reservation p_rsv:
-- p_taken leaves the reservation and held, p_charged leaves the balance
-- (their ledger rows are inserted by the same transaction). A reservation
-- that is gone aborts the transaction: the batch is then applied charge by
-- charge (tollgate_charge).
CREATE FUNCTION tollgate_take(p_rsv text, p_account text, p_key text, p_taken bigint, p_charged bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM accounts WHERE id = p_account FOR UPDATE;
    UPDATE holds SET amount = amount - p_taken WHERE id = p_rsv AND request_id = '';
    IF NOT FOUND THEN RAISE EXCEPTION 'reservation % is gone', p_rsv USING ERRCODE = 'P0002'; END IF;
    UPDATE accounts SET balance = balance - p_charged, held = held - p_taken WHERE id = p_account;
    UPDATE api_keys SET spent = spent + p_charged, held = held - p_taken WHERE id = p_key;
END $$;

-- tollgate_charge settles one request held in memory against reservation
-- p_rsv: charged = min(cost, free balance + p_covered); p_covered + p_return
-- leave the reservation. A reservation that is gone (swept) pays nothing:
-- the charge comes from the free balance alone. A hold already charged
-- returns its charge (replayed).
CREATE FUNCTION tollgate_charge(p_hold text, p_rsv text, p_id text, p_account text, p_key text, p_model text,
    p_class text, p_node text, p_prompt bigint, p_completion bigint, p_cached bigint, p_reasoning bigint,
    p_in_rate bigint, p_out_rate bigint, p_cost bigint, p_covered bigint, p_return bigint, p_estimated boolean,
    p_time timestamptz, OUT charged bigint, OUT uncollected bigint, OUT replayed boolean, OUT gone boolean)
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
        prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, input_rate, output_rate, cost, uncollected, estimated)
    VALUES (p_id, 'charge', p_account, -charged, p_time, p_hold, p_key, p_model, p_class, p_node,
        p_prompt, p_completion, p_cached, p_reasoning, p_in_rate, p_out_rate, p_cost, uncollected, p_estimated);
END $$;
