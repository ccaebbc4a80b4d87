CREATE TABLE IF NOT EXISTS "watermill_versions" (
    consumer TEXT    NOT NULL,
    entity   TEXT    NOT NULL,
    version  INTEGER NOT NULL,
    PRIMARY KEY (consumer, entity)
);
