-- Outbox tables created before 0.1.0 lack attempts and message_bytes
-- (migration 1 adopts them as they are). MySQL has no ADD COLUMN IF NOT
-- EXISTS, so each column is added only when information_schema does not
-- list it; a table that has both is left alone. A row written before has
-- message_bytes 0: the relay then counts it as empty toward MaxBatchBytes.
SET @outbox_ddl = (SELECT IF(COUNT(*) = 0, 'ALTER TABLE `watermill_outbox` ADD COLUMN `attempts` INT NOT NULL DEFAULT 0', 'DO 0')
    FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'watermill_outbox' AND column_name = 'attempts');
PREPARE outbox_stmt FROM @outbox_ddl;
EXECUTE outbox_stmt;
DEALLOCATE PREPARE outbox_stmt;
SET @outbox_ddl = (SELECT IF(COUNT(*) = 0, 'ALTER TABLE `watermill_outbox` ADD COLUMN `message_bytes` BIGINT NOT NULL DEFAULT 0', 'DO 0')
    FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'watermill_outbox' AND column_name = 'message_bytes');
PREPARE outbox_stmt FROM @outbox_ddl;
EXECUTE outbox_stmt;
DEALLOCATE PREPARE outbox_stmt;
