-- The outbox table. message_bytes is written with the row, so the relay
-- can bound a batch by bytes without reading any BLOB.
CREATE TABLE IF NOT EXISTS `watermill_outbox` (
    `id`            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    `topic`         VARCHAR(255) NOT NULL,
    `uuid`          VARCHAR(255) NOT NULL,
    `payload`       LONGBLOB     NOT NULL,
    `metadata`      LONGTEXT     NOT NULL,
    `created_at`    DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    `attempts`      INT          NOT NULL DEFAULT 0,
    `message_bytes` BIGINT       NOT NULL DEFAULT 0
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
-- Rows the relay gave up on (see DeadLetters).
CREATE TABLE IF NOT EXISTS `watermill_outbox_dead_letters` (
    `id`               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    `outbox_id`        BIGINT       NOT NULL,
    `topic`            VARCHAR(255) NOT NULL,
    `uuid`             VARCHAR(255) NOT NULL,
    `payload`          LONGBLOB     NOT NULL,
    `metadata`         LONGTEXT     NOT NULL,
    `attempts`         INT          NOT NULL,
    `last_error`       TEXT         NOT NULL,
    `created_at`       DATETIME(6)  NOT NULL,
    `dead_lettered_at` DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
