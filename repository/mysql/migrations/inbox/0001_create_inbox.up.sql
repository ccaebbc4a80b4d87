-- consumer, dedup_key and lease_owner are VARBINARY(255): byte-exact
-- comparison on every server (case, accents and trailing spaces all
-- count), and 255 bytes is exactly repository.MaxKeyLength. A utf8mb4
-- column would not do: the _ci collations fold case and accents,
-- utf8mb4_bin ignores trailing spaces (PAD SPACE), and the one exact
-- collation, utf8mb4_0900_bin, exists only on MySQL 8. Timestamps are
-- DATETIME(6) in UTC.
CREATE TABLE IF NOT EXISTS `watermill_inbox` (
    consumer     VARBINARY(255) NOT NULL,
    dedup_key    VARBINARY(255) NOT NULL,
    state        VARCHAR(16)    NOT NULL,
    payload_hash VARBINARY(255),
    result       LONGBLOB,
    attempts     INT            NOT NULL DEFAULT 1,
    lease_owner  VARBINARY(255),
    lease_until  DATETIME(6),
    created_at   DATETIME(6)    NOT NULL,
    completed_at DATETIME(6),
    expires_at   DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, dedup_key),
    KEY `watermill_inbox_expires_at_idx` (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
