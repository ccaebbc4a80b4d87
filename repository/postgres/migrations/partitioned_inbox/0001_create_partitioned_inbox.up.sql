-- The partitioned inbox (NewPartitionedRepository): the inbox's columns,
-- range-partitioned by expires_at, so that cleanup drops whole
-- partitions instead of deleting rows. PostgreSQL requires every unique
-- constraint of a partitioned table to include the partition key, so the
-- primary key cannot say "one row per (consumer, dedup_key)" any more: a
-- transaction-scoped advisory lock per key, taken by every claim, does
-- (see internal/sqlstore/partitioned.go). The primary key still serves
-- the lookup by (consumer, dedup_key) in every partition.
-- Partitions are created by the store (Migrate, cleanup, and a claim
-- whose partition is missing), one per interval of expires_at.
CREATE TABLE IF NOT EXISTS "watermill_inbox" (
    consumer     VARCHAR(255) NOT NULL,
    dedup_key    VARCHAR(255) NOT NULL,
    state        VARCHAR(16)  NOT NULL,
    payload_hash BYTEA,
    result       BYTEA,
    attempts     INTEGER      NOT NULL DEFAULT 1,
    lease_owner  VARCHAR(255),
    lease_until  TIMESTAMPTZ,
    created_at   TIMESTAMPTZ  NOT NULL,
    completed_at TIMESTAMPTZ,
    expires_at   TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (consumer, dedup_key, expires_at)
) PARTITION BY RANGE (expires_at);
CREATE INDEX IF NOT EXISTS "watermill_inbox_lease_until_idx" ON "watermill_inbox" (lease_until) WHERE state = 'in_progress';
