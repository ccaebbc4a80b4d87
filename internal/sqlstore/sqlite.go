package sqlstore

import (
	"fmt"
	"time"
)

// SQLite is SQLite 3.35+ through modernc.org/sqlite, timestamps as Unix
// microseconds. It has one writer at a time and no row locks: a
// transaction begun with BEGIN IMMEDIATE (repository/sqlite's DSN) holds
// the write lock from its start, so nothing a statement reads is locked by
// another writer. Every statement it sends is here.
var SQLite = &Dialect{
	Name: "sqlite", Quote: `"`, Bind: QuestionNumbered,
	QualifyIndex: true,
	Returning:    true,
	// SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE.
	UniqueViolation: []string{"1555", "2067"},
	EncodeTime:      func(t time.Time) (any, error) { return t.UnixMicro(), nil },
	DecodeTime: func(v any) (time.Time, error) {
		us, ok := v.(int64)
		if !ok {
			return time.Time{}, fmt.Errorf("sqlite: cannot scan %T into a timestamp", v)
		}
		return time.UnixMicro(us).UTC(), nil
	},

	Inbox: InboxSQL{
		Claim: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES (?1, ?2, 'completed', ?3, 1, ?4, ?4, ?5) ON CONFLICT (consumer, dedup_key) DO NOTHING`),
		ClaimBatch: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES (?1, ?2, 'completed', ?3, 1, ?4, ?4, ?5) ON CONFLICT (consumer, dedup_key) DO NOTHING RETURNING consumer, dedup_key`),
		Get: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE consumer = ?1 AND dedup_key = ?2`),
		LockedGet: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE consumer = ?1 AND dedup_key = ?2`),
		Save:   q(`UPDATE {T} SET result = ?3 WHERE consumer = ?1 AND dedup_key = ?2`),
		Exists: q(`SELECT COUNT(*) FROM {T} WHERE consumer = ?1 AND dedup_key = ?2`),
		Acquire: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, lease_owner, lease_until, created_at, expires_at)
VALUES (?1, ?2, 'in_progress', ?3, 1, ?4, ?5, ?6, ?7) ON CONFLICT (consumer, dedup_key) DO NOTHING`),
		Reclaim: q(`UPDATE {T} SET lease_owner = ?4, lease_until = ?6, attempts = attempts + 1
WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3 AND lease_until <= ?5
RETURNING consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at`),
		Extend: q(`UPDATE {T} SET lease_until = ?4
WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3`),
		ExtendCheck: q(`SELECT COUNT(*) FROM {T}
WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3 AND lease_until = ?4`),
		Complete: q(`UPDATE {T} SET state = 'completed', result = ?4, completed_at = ?5
WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3`),
		Release: q(`DELETE FROM {T} WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3`),
		// Text compares by bytes (BINARY collation).
		List: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE state = 'in_progress' AND lease_until <= ?1 AND expires_at > ?1 AND (?2 = '' OR consumer = ?2)
ORDER BY lease_until, consumer, dedup_key LIMIT ?3`),
		ResolveComplete: q(`UPDATE {T} SET state = 'completed', result = ?5, completed_at = ?4
WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3 AND lease_until <= ?4 AND expires_at > ?4`),
		ResolveRelease: q(`DELETE FROM {T}
WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3 AND lease_until <= ?4 AND expires_at > ?4`),
		Live: q(`SELECT COUNT(*) FROM {T} WHERE consumer = ?1 AND dedup_key = ?2 AND expires_at > ?3`),
		Count: q(`SELECT consumer,
	COUNT(CASE WHEN state = 'in_progress' AND lease_until > ?1 THEN 1 END),
	COUNT(CASE WHEN state = 'in_progress' AND lease_until <= ?1 THEN 1 END),
	COUNT(CASE WHEN state = 'completed' THEN 1 END)
FROM {T} WHERE expires_at > ?1
GROUP BY consumer ORDER BY consumer`),
		DeleteExpired: q(`DELETE FROM {T} WHERE rowid IN (SELECT rowid FROM {T} WHERE expires_at < ?1 ORDER BY expires_at LIMIT ?2)`),
	},

	Versions: VersionsSQL{
		Advance: []SQL{q(`INSERT INTO {T} AS v (consumer, entity, version) VALUES (?1, ?2, ?3)
ON CONFLICT (consumer, entity) DO UPDATE SET version = excluded.version WHERE v.version < excluded.version`)},
		Last: q(`SELECT version FROM {T} WHERE consumer = ?1 AND entity = ?2 AND version > -9223372036854775808`),
	},

	// The relay's transaction is a write transaction from its BEGIN, so
	// what a batch reads is its own: no row locks, no SKIP LOCKED. Times
	// are the process clock's Unix microseconds (SQLite's own has
	// milliseconds), the clock the relay measures ages on; id lists ($1)
	// are JSON arrays.
	Outbox: OutboxSQL{
		Insert:      q(`INSERT INTO {T} (topic, uuid, payload, metadata, created_at) VALUES (?1, ?2, ?3, ?4, ?5)`),
		InsertValue: func(_ int, now int64) any { return now },
		Claim: q(`SELECT id, length(payload) + length(CAST(metadata AS BLOB)) + length(CAST(uuid AS BLOB)) + length(CAST(topic AS BLOB))
FROM {T} WHERE id > ?1 ORDER BY id LIMIT ?2`),
		ClaimLocks: true,
		Fetch:      q(`SELECT id, topic, uuid, payload, metadata, attempts, ?2 - created_at FROM {T} WHERE id IN (SELECT value FROM json_each(?1))`),
		IDs:        jsonIDs,
		DeleteIDs:  q(`DELETE FROM {T} WHERE id IN (SELECT value FROM json_each(?1))`),
		Charge:     q(`UPDATE {T} SET attempts = attempts + 1 WHERE id = ?1`),
		DeadLetter: q(`INSERT INTO {D} (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at, dead_lettered_at)
SELECT id, topic, uuid, payload, metadata, attempts + ?2, ?3, created_at, ?4 FROM {T} WHERE id = ?1`),
		DeleteOne: q(`DELETE FROM {T} WHERE id = ?1`),
		Backlog:   q(`SELECT COUNT(*), COALESCE(?1 - MIN(created_at), 0), (SELECT COUNT(*) FROM {D}) FROM {T}`),
		ListDead: q(`SELECT id, outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at, dead_lettered_at
FROM {T} WHERE id > ?1 AND (?2 = '' OR topic = ?2) ORDER BY id LIMIT ?3`),
		CountDead:  q(`SELECT COUNT(*) FROM {T}`),
		LockDead:   q(`SELECT id FROM {T} WHERE id IN (SELECT value FROM json_each(?1)) ORDER BY id`),
		CopyDead:   q(`INSERT INTO {T} (topic, uuid, payload, metadata, created_at) SELECT topic, uuid, payload, metadata, ?2 FROM {D} WHERE id IN (SELECT value FROM json_each(?1)) ORDER BY id`),
		DeleteDead: q(`DELETE FROM {T} WHERE id IN (SELECT value FROM json_each(?1))`),
	},

	Migrate: MigrateSQL{
		Probe:   q(`SELECT COUNT(*) FROM {T} WHERE 1 = 0`),
		Forget:  q(`DELETE FROM {T} WHERE subject = ?1`),
		Applied: q(`SELECT version FROM {T} WHERE subject = ?1`),
		Record:  q(`INSERT INTO {T} (subject, version, name) VALUES (?1, ?2, ?3)`),
	},
}
