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
    PRIMARY KEY (consumer, dedup_key)
);
CREATE INDEX IF NOT EXISTS "watermill_inbox_expires_at_idx" ON "watermill_inbox" (expires_at);
