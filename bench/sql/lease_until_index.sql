\set ON_ERROR_STOP 1
DROP TABLE IF EXISTS idxbench;
CREATE TABLE idxbench (
    consumer VARCHAR(255) NOT NULL, dedup_key VARCHAR(255) NOT NULL, state VARCHAR(16) NOT NULL,
    payload_hash BYTEA, result BYTEA, attempts INTEGER NOT NULL DEFAULT 1,
    lease_owner VARCHAR(255), lease_until TIMESTAMPTZ, created_at TIMESTAMPTZ NOT NULL, completed_at TIMESTAMPTZ,
    expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (consumer, dedup_key));
CREATE INDEX idxbench_expires_at_idx ON idxbench (expires_at);
-- 1,000,000 rows, 10 consumers; 1 % in progress (half of them under an expired lease), the rest completed.
INSERT INTO idxbench
SELECT 'consumer-' || (i % 10), 'key-' || i,
       CASE WHEN i % 100 = 0 THEN 'in_progress' ELSE 'completed' END,
       sha256(i::text::bytea), NULL, 1,
       CASE WHEN i % 100 = 0 THEN 'owner-' || i END,
       CASE WHEN i % 100 = 0 THEN now() + ((CASE WHEN i % 200 = 0 THEN -1 ELSE 1 END) * interval '1 minute') + i * interval '1 millisecond' END,
       now() - interval '1 hour', CASE WHEN i % 100 <> 0 THEN now() END, now() + interval '1 day'
FROM generate_series(1, 1000000) AS i;
VACUUM ANALYZE idxbench;
\timing on
\echo === before: ListStuck
EXPLAIN (ANALYZE, BUFFERS) SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at FROM idxbench WHERE state = 'in_progress' AND lease_until <= now() AND expires_at > now() AND ('' = '' OR consumer = '') ORDER BY lease_until, consumer COLLATE "C", dedup_key COLLATE "C" LIMIT 100;
\echo === before: CountRecords
EXPLAIN (ANALYZE, BUFFERS) SELECT consumer, COUNT(CASE WHEN state = 'in_progress' AND lease_until > now() THEN 1 END), COUNT(CASE WHEN state = 'in_progress' AND lease_until <= now() THEN 1 END), COUNT(CASE WHEN state = 'completed' THEN 1 END) FROM idxbench WHERE expires_at > now() GROUP BY consumer ORDER BY consumer COLLATE "C";
\echo === migration 2
CREATE INDEX IF NOT EXISTS idxbench_lease_until_idx ON idxbench (lease_until) WHERE state = 'in_progress';
ANALYZE idxbench;
\echo === after: ListStuck
EXPLAIN (ANALYZE, BUFFERS) SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at FROM idxbench WHERE state = 'in_progress' AND lease_until <= now() AND expires_at > now() AND ('' = '' OR consumer = '') ORDER BY lease_until, consumer COLLATE "C", dedup_key COLLATE "C" LIMIT 100;
\echo === after: CountRecords
EXPLAIN (ANALYZE, BUFFERS) SELECT consumer, COUNT(CASE WHEN state = 'in_progress' AND lease_until > now() THEN 1 END), COUNT(CASE WHEN state = 'in_progress' AND lease_until <= now() THEN 1 END), COUNT(CASE WHEN state = 'completed' THEN 1 END) FROM idxbench WHERE expires_at > now() GROUP BY consumer ORDER BY consumer COLLATE "C";
\timing off
SELECT pg_size_pretty(pg_relation_size('idxbench')) AS heap, pg_size_pretty(pg_relation_size('idxbench_lease_until_idx')) AS lease_idx;
DROP TABLE idxbench;
