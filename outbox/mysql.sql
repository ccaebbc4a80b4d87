CREATE TABLE IF NOT EXISTS `watermill_outbox` (
    `id`         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    `topic`      VARCHAR(255) NOT NULL,
    `uuid`       VARCHAR(255) NOT NULL,
    `payload`    LONGBLOB     NOT NULL,
    `metadata`   LONGTEXT     NOT NULL,
    `created_at` DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
