-- Consumer and entity are VARBINARY(255), compared byte for byte like the
-- inbox's keys.
CREATE TABLE IF NOT EXISTS `watermill_versions` (
    consumer VARBINARY(255) NOT NULL,
    entity   VARBINARY(255) NOT NULL,
    version  BIGINT         NOT NULL,
    PRIMARY KEY (consumer, entity)
) ENGINE=InnoDB;
