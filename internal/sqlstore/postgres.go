package sqlstore

import (
	"strings"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Postgres is PostgreSQL (10+), through pgx/v5: database/sql with its
// stdlib driver, or natively (pgxexec). Every statement it sends is here.
var Postgres = &Dialect{
	Name: "postgres", Quote: `"`, Bind: Dollar,
	Returning: true,
	// A transaction-level advisory lock, the one every migration line
	// takes (inbox, versions, outbox): concurrent CREATE … IF NOT EXISTS
	// can still fail on the catalog's unique index.
	MigrateLock:     `SELECT 1 FROM pg_advisory_xact_lock(hashtext('watermill-idempotent-migrate'))`,
	UniqueViolation: []string{"23505"}, // unique_violation
	Deadlock:        []string{"40P01"}, // deadlock_detected

	Inbox: InboxSQL{
		Claim: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES ($1, $2, 'completed', $3, 1, $4, $4, $5) ON CONFLICT (consumer, dedup_key) DO NOTHING`),
		ClaimBatch: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES ($1, $2, 'completed', $3, 1, $4, $4, $5) ON CONFLICT (consumer, dedup_key) DO NOTHING RETURNING consumer, dedup_key`),
		Get: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE consumer = $1 AND dedup_key = $2`),
		// READ COMMITTED reads the latest committed row anyway.
		LockedGet: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE consumer = $1 AND dedup_key = $2`),
		Save:   q(`UPDATE {T} SET result = $3 WHERE consumer = $1 AND dedup_key = $2`),
		Exists: q(`SELECT COUNT(*) FROM {T} WHERE consumer = $1 AND dedup_key = $2`),
		Acquire: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, lease_owner, lease_until, created_at, expires_at)
VALUES ($1, $2, 'in_progress', $3, 1, $4, $5, $6, $7) ON CONFLICT (consumer, dedup_key) DO NOTHING`),
		Reclaim: q(`UPDATE {T} SET lease_owner = $4, lease_until = $6, attempts = attempts + 1
WHERE consumer = $1 AND dedup_key = $2 AND state = 'in_progress' AND lease_owner = $3 AND lease_until <= $5
RETURNING consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at`),
		Extend: q(`UPDATE {T} SET lease_until = $4
WHERE consumer = $1 AND dedup_key = $2 AND state = 'in_progress' AND lease_owner = $3`),
		ExtendCheck: q(`SELECT COUNT(*) FROM {T}
WHERE consumer = $1 AND dedup_key = $2 AND state = 'in_progress' AND lease_owner = $3 AND lease_until = $4`),
		Complete: q(`UPDATE {T} SET state = 'completed', result = $4, completed_at = $5
WHERE consumer = $1 AND dedup_key = $2 AND state = 'in_progress' AND lease_owner = $3`),
		Release: q(`DELETE FROM {T} WHERE consumer = $1 AND dedup_key = $2 AND state = 'in_progress' AND lease_owner = $3`),
		List: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE state = 'in_progress' AND lease_until <= $1 AND expires_at > $1 AND ($2 = '' OR consumer = $2)
ORDER BY lease_until, consumer COLLATE "C", dedup_key COLLATE "C" LIMIT $3`),
		ResolveComplete: q(`UPDATE {T} SET state = 'completed', result = $5, completed_at = $4
WHERE consumer = $1 AND dedup_key = $2 AND state = 'in_progress' AND lease_owner = $3 AND lease_until <= $4 AND expires_at > $4`),
		ResolveRelease: q(`DELETE FROM {T}
WHERE consumer = $1 AND dedup_key = $2 AND state = 'in_progress' AND lease_owner = $3 AND lease_until <= $4 AND expires_at > $4`),
		Live: q(`SELECT COUNT(*) FROM {T} WHERE consumer = $1 AND dedup_key = $2 AND expires_at > $3`),
		Count: q(`SELECT consumer,
	COUNT(CASE WHEN state = 'in_progress' AND lease_until > $1 THEN 1 END),
	COUNT(CASE WHEN state = 'in_progress' AND lease_until <= $1 THEN 1 END),
	COUNT(CASE WHEN state = 'completed' THEN 1 END)
FROM {T} WHERE expires_at > $1
GROUP BY consumer ORDER BY consumer COLLATE "C"`),
		DeleteExpired: q(`DELETE FROM {T} WHERE (consumer, dedup_key) IN (
	SELECT consumer, dedup_key FROM {T} WHERE expires_at < $1
	ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`),
		// One statement looks the key up in every partition, inserts it
		// only if absent and returns the record it found: one scan, one
		// snapshot, so a record seen is a record returned even while
		// cleanup detaches a partition. No row back: the key was inserted.
		PartitionedClaim: q(`WITH found AS (SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
	FROM {T} WHERE consumer = $1 AND dedup_key = $2 LIMIT 1),
inserted AS (INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
	SELECT $1::varchar, $2::varchar, 'completed', $3::bytea, 1, $4::timestamptz, $4::timestamptz, $5::timestamptz
	WHERE NOT EXISTS (SELECT 1 FROM found))
SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at FROM found`),
		PartitionedAcquire: q(`WITH found AS (SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
	FROM {T} WHERE consumer = $1 AND dedup_key = $2 LIMIT 1),
inserted AS (INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, lease_owner, lease_until, created_at, expires_at)
	SELECT $1::varchar, $2::varchar, 'in_progress', $3::bytea, 1, $4::varchar, $5::timestamptz, $6::timestamptz, $7::timestamptz
	WHERE NOT EXISTS (SELECT 1 FROM found))
SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at FROM found`),
	},

	Versions: VersionsSQL{
		Advance: []SQL{q(`INSERT INTO {T} AS v (consumer, entity, version) VALUES ($1, $2, $3)
ON CONFLICT (consumer, entity) DO UPDATE SET version = excluded.version WHERE v.version < excluded.version`)},
		Last: q(`SELECT version FROM {T} WHERE consumer = $1 AND entity = $2 AND version > -9223372036854775808`),
	},

	Outbox: OutboxSQL{
		Insert: q(`INSERT INTO {T} (topic, uuid, payload, metadata) VALUES ($1, $2, $3, $4)`),
		// octet_length of a TOASTed bytea reads its stored size without
		// detoasting the payload, so the claim locks the rows without
		// reading a payload.
		Claim: q(`SELECT id, octet_length(payload)::bigint + octet_length(metadata::text) + octet_length(uuid) + octet_length(topic)
FROM {T} WHERE id > $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`),
		ClaimLocks: true,
		// Ages are computed on the database's clock: the application's
		// may be skewed.
		Fetch: q(`SELECT id, topic, uuid, payload, metadata, attempts, (EXTRACT(EPOCH FROM statement_timestamp() - created_at) * 1000000)::bigint
FROM {T} WHERE id = ANY($1)`),
		IDs:       func(ids []int64) any { return ids },
		DeleteIDs: q(`DELETE FROM {T} WHERE id = ANY($1)`),
		Charge:    q(`UPDATE {T} SET attempts = attempts + 1 WHERE id = $1`),
		DeadLetter: q(`INSERT INTO {D} (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at)
SELECT id, topic, uuid, payload, metadata, attempts + $2, $3, created_at FROM {T} WHERE id = $1`),
		DeleteOne: q(`DELETE FROM {T} WHERE id = $1`),
		Backlog: q(`SELECT COUNT(*), COALESCE((EXTRACT(EPOCH FROM statement_timestamp() - MIN(created_at)) * 1000000)::bigint, 0),
	(SELECT COUNT(*) FROM {D}) FROM {T}`),
		ListDead: q(`SELECT id, outbox_id, topic, uuid, payload, metadata::text, attempts, last_error,
	(EXTRACT(EPOCH FROM created_at) * 1000000)::bigint, (EXTRACT(EPOCH FROM dead_lettered_at) * 1000000)::bigint
FROM {T} WHERE id > $1 AND ($2 = '' OR topic = $2) ORDER BY id LIMIT $3`),
		CountDead: q(`SELECT COUNT(*) FROM {T}`),
		// The lock makes the database decide between two concurrent
		// requeues of one row: the second finds it gone.
		LockDead:   q(`SELECT id FROM {T} WHERE id = ANY($1) ORDER BY id FOR UPDATE`),
		CopyDead:   q(`INSERT INTO {T} (topic, uuid, payload, metadata) SELECT topic, uuid, payload, metadata FROM {D} WHERE id = ANY($1) ORDER BY id`),
		DeleteDead: q(`DELETE FROM {T} WHERE id = ANY($1)`),
		// The trigger's function lives in the table's schema and names
		// its channel.
		Renames: func(table string) []string {
			fn := `"` + repository.IndexName(table, "notify") + `"`
			if i := strings.LastIndexByte(table, '.'); i >= 0 {
				fn = `"` + table[:i] + `".` + fn
			}
			return []string{`FUNCTION "watermill_outbox_notify"`, "FUNCTION " + fn,
				`'watermill_outbox'`, `'` + NotifyChannel(table) + `'`}
		},
	},

	Migrate: MigrateSQL{
		Probe:   q(`SELECT COUNT(*) FROM {T} WHERE 1 = 0`),
		Forget:  q(`DELETE FROM {T} WHERE subject = $1`),
		Applied: q(`SELECT version FROM {T} WHERE subject = $1`),
		Record:  q(`INSERT INTO {T} (subject, version, name) VALUES ($1, $2, $3)`),
	},
}
