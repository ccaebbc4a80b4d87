CREATE TABLE IF NOT EXISTS "watermill_versions" (
    consumer VARCHAR(255) NOT NULL,
    entity   VARCHAR(255) NOT NULL,
    version  BIGINT       NOT NULL,
    PRIMARY KEY (consumer, entity)
);
