-- ListStuck reads in-progress records under an expired lease, oldest
-- lease first: the index finds them without scanning the table (InnoDB
-- has no partial indexes, so it holds every row).
CREATE INDEX `watermill_inbox_lease_until_idx` ON `watermill_inbox` (state, lease_until);
