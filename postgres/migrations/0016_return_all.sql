-- tollgate_return_all gives back everything reservation p_rsv holds and
-- deletes its row (docs/billing.md, "Reservations"): an instance calls it
-- when its reservation is idle, so that what it counts in memory, which a
-- lost answer can leave wrong, never decides what goes back. returned is
-- what the row held; gone if there is no such row (never created, already
-- returned or swept), which changes nothing. Lock order as everywhere: the
-- account row first.
--
-- A new function beside tollgate_return, which stays as it is: instances of
-- the previous version go on calling it during a rolling upgrade.
CREATE FUNCTION tollgate_return_all(p_rsv text, p_account text, OUT gone boolean, OUT returned bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
BEGIN
    gone := false; returned := 0;
    PERFORM 1 FROM accounts WHERE id = p_account FOR UPDATE;
    DELETE FROM holds WHERE id = p_rsv AND request_id = '' AND account_id = p_account RETURNING amount, key_id INTO returned, v_key;
    IF NOT FOUND THEN gone := true; returned := 0; RETURN; END IF;
    UPDATE accounts SET held = held - returned WHERE id = p_account;
    UPDATE api_keys SET held = held - returned WHERE id = v_key;
END $$;
