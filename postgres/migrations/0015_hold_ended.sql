-- When the store learnt that a hold's request had ended (docs/billing.md,
-- "No hold stranded"): NULL while it runs. A settle or a release deletes
-- the row, so only a hold whose settle or release could not be written
-- (the store was away, or refused it) is ever marked, by its instance's
-- retry. Renewals skip a marked hold, any sweeper releases it one sweep
-- interval after its mark, and the audit reports one marked longer ago
-- than its grace.
--
-- The partial index holds marked rows only: a hold's insert (a write many
-- requests make) does not touch it.

ALTER TABLE holds ADD COLUMN ended timestamptz;

CREATE INDEX holds_ended ON holds (ended) WHERE ended IS NOT NULL;
