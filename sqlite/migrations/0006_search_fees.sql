-- Web search fees on a charge (docs/billing.md, "Web search fees"): the
-- number of searches that ran for the request and the price of one, in
-- picodollars. A charge's cost is prompt × input + completion × output +
-- searches × search_price; amount stays −(cost − uncollected), so the audit,
-- which sums amounts, is unchanged. Rows written before this migration (and
-- every row that is not a charge) read as no search.
ALTER TABLE ledger ADD COLUMN searches     INTEGER NOT NULL DEFAULT 0;
ALTER TABLE ledger ADD COLUMN search_price INTEGER NOT NULL DEFAULT 0;
