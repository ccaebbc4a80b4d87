-- The inbox table. Timestamps are Unix microseconds.
CREATE TABLE IF NOT EXISTS "watermill_inbox" (
    consumer     TEXT    NOT NULL,
    dedup_key    TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    payload_hash BLOB,
    result       BLOB,
    attempts     INTEGER NOT NULL DEFAULT 1,
    lease_owner  TEXT,
    lease_until  INTEGER,
    created_at   INTEGER NOT NULL,
    completed_at INTEGER,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (consumer, dedup_key)
);
CREATE INDEX IF NOT EXISTS "watermill_inbox_expires_at_idx" ON "watermill_inbox" (expires_at);
