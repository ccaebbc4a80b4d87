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
