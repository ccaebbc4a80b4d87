-- ListStuck reads in-progress records under an expired lease, oldest
-- lease first: a partial index holds only the in-progress rows, so the
-- listing no longer scans the table and transactional claims (inserted
-- completed) never touch the index.
CREATE INDEX IF NOT EXISTS "watermill_inbox_lease_until_idx" ON "watermill_inbox" (lease_until) WHERE state = 'in_progress';
