DROP INDEX IF EXISTS "watermill_inbox_lease_until_idx";
