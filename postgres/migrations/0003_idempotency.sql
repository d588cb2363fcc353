-- Idempotency-Key (docs/idempotency.md): one row per key in use or
-- remembered.
--
-- A row is in flight while status = 0: owner holds it until expires (the
-- lease, renewed while the request runs). Once the request succeeded, status,
-- header and body hold its response and expires is when it is forgotten.
-- A row whose expires has passed is free: the next claim takes it over
-- (INSERT ... ON CONFLICT DO UPDATE ... WHERE expires <= now, atomic across
-- instances), and the purge deletes it.
CREATE TABLE idempotency_keys (
    scope       text        NOT NULL, -- the account id
    key         text        NOT NULL, -- the header's value (printable ASCII, at most 255 bytes)
    fingerprint bytea       NOT NULL, -- SHA-256 of the model and the canonical body
    owner       text        NOT NULL, -- request id of the attempt holding (or having held) the key
    created     timestamptz NOT NULL, -- when that attempt began
    expires     timestamptz NOT NULL, -- end of the lease (in flight) or of the memory (done)
    status      integer     NOT NULL DEFAULT 0, -- 0: in flight; else the stored HTTP status
    header      text        NOT NULL DEFAULT '',
    body        bytea,
    PRIMARY KEY (scope, key)
);

CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires);
