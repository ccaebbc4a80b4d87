DROP TABLE IF EXISTS "watermill_outbox_dead_letters";
DROP TABLE IF EXISTS "watermill_outbox";
