-- The outbox table. Timestamps are Unix microseconds. AUTOINCREMENT:
-- ids are never reused, so the relay's id order is insertion order.
CREATE TABLE IF NOT EXISTS "watermill_outbox" (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    topic      TEXT    NOT NULL,
    uuid       TEXT    NOT NULL,
    payload    BLOB    NOT NULL,
    metadata   TEXT    NOT NULL,
    created_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)),
    attempts   INTEGER NOT NULL DEFAULT 0
);
-- Rows the relay gave up on (see DeadLetters).
CREATE TABLE IF NOT EXISTS "watermill_outbox_dead_letters" (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    outbox_id        INTEGER NOT NULL,
    topic            TEXT    NOT NULL,
    uuid             TEXT    NOT NULL,
    payload          BLOB    NOT NULL,
    metadata         TEXT    NOT NULL,
    attempts         INTEGER NOT NULL,
    last_error       TEXT    NOT NULL,
    created_at       INTEGER NOT NULL,
    dead_lettered_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))
);
