package sqlstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// MySQL is MySQL 8.0+ and MariaDB 10.6+ (InnoDB), through
// github.com/go-sql-driver/mysql, whose ? placeholders take their
// arguments in order: each statement lists the argument each ? takes.
// Every statement it sends is here; repository/mysql adds the driver's
// error numbers (With).
var MySQL = &Dialect{
	Name: "mysql", Quote: "`", Bind: Question,
	// A session lock, the one every migration line takes: if the
	// connection dies, the server drops it. It waits up to a minute.
	MigrateLock:   `SELECT GET_LOCK('watermill_idempotent_migrate', 60)`,
	MigrateUnlock: `DO RELEASE_LOCK('watermill_idempotent_migrate')`,
	// An UPDATE storing the values already there reports no changed row.
	ChangedRows: true,
	// The payload_hash column is VARBINARY(255).
	MaxPayloadHash: 255,
	// DATETIME(6) in UTC, checked to fit (years 1000 to 9999).
	EncodeTime: encodeDatetime,
	DecodeTime: decodeDatetime,
	// ER_DUP_ENTRY, ER_DUP_ENTRY_WITH_KEY_NAME, ER_DUP_KEY; ER_LOCK_DEADLOCK;
	// ER_TABLE_EXISTS_ERROR, ER_DUP_KEYNAME (a migration statement that ran
	// before a crash: DDL commits statement by statement).
	UniqueViolation: []string{"1062", "1586", "1022"},
	Deadlock:        []string{"1213"},
	AlreadyDone:     []string{"1050", "1061"},

	// No conflict clause: a taken key fails the INSERT with a unique
	// violation, which InnoDB rolls back alone. LOCK IN SHARE MODE reads
	// the latest committed row, not the REPEATABLE READ snapshot; MySQL 8
	// and every MariaDB understand it.
	Inbox: InboxSQL{
		Claim: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES (?, ?, 'completed', ?, 1, ?, ?, ?)`, 1, 2, 3, 4, 4, 5),
		ClaimBatch: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES (?, ?, 'completed', ?, 1, ?, ?, ?)`, 1, 2, 3, 4, 4, 5),
		Get: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE consumer = ? AND dedup_key = ?`, 1, 2),
		LockedGet: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE consumer = ? AND dedup_key = ? LOCK IN SHARE MODE`, 1, 2),
		Save:   q(`UPDATE {T} SET result = ? WHERE consumer = ? AND dedup_key = ?`, 3, 1, 2),
		Exists: q(`SELECT COUNT(*) FROM {T} WHERE consumer = ? AND dedup_key = ? LOCK IN SHARE MODE`, 1, 2),
		Acquire: q(`INSERT INTO {T} (consumer, dedup_key, state, payload_hash, attempts, lease_owner, lease_until, created_at, expires_at)
VALUES (?, ?, 'in_progress', ?, 1, ?, ?, ?, ?)`, 1, 2, 3, 4, 5, 6, 7),
		// No RETURNING: Reclaim reads the row in the same transaction.
		Reclaim: q(`UPDATE {T} SET lease_owner = ?, lease_until = ?, attempts = attempts + 1
WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ? AND lease_until <= ?`, 4, 6, 1, 2, 3, 5),
		Extend: q(`UPDATE {T} SET lease_until = ?
WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ?`, 4, 1, 2, 3),
		ExtendCheck: q(`SELECT COUNT(*) FROM {T}
WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ? AND lease_until = ?`, 1, 2, 3, 4),
		Complete: q(`UPDATE {T} SET state = 'completed', result = ?, completed_at = ?
WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ?`, 4, 5, 1, 2, 3),
		Release: q(`DELETE FROM {T} WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ?`, 1, 2, 3),
		List: q(`SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM {T} WHERE state = 'in_progress' AND lease_until <= ? AND expires_at > ? AND (? = '' OR consumer = ?)
ORDER BY lease_until, consumer, dedup_key LIMIT ?`, 1, 1, 2, 2, 3),
		ResolveComplete: q(`UPDATE {T} SET state = 'completed', result = ?, completed_at = ?
WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ? AND lease_until <= ? AND expires_at > ?`, 5, 4, 1, 2, 3, 4, 4),
		ResolveRelease: q(`DELETE FROM {T}
WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ? AND lease_until <= ? AND expires_at > ?`, 1, 2, 3, 4, 4),
		Live: q(`SELECT COUNT(*) FROM {T} WHERE consumer = ? AND dedup_key = ? AND expires_at > ?`, 1, 2, 3),
		Count: q(`SELECT consumer,
	COUNT(CASE WHEN state = 'in_progress' AND lease_until > ? THEN 1 END),
	COUNT(CASE WHEN state = 'in_progress' AND lease_until <= ? THEN 1 END),
	COUNT(CASE WHEN state = 'completed' THEN 1 END)
FROM {T} WHERE expires_at > ?
GROUP BY consumer ORDER BY consumer`, 1, 1, 1),
		// A DELETE … LIMIT cannot skip locked rows: one READ COMMITTED
		// transaction picks them, then deletes them by primary key.
		PickExpired: q(`SELECT consumer, dedup_key FROM {T} WHERE expires_at < ? ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`, 1, 2),
		DeleteByKeys: func(n int) SQL {
			s := q(`DELETE x FROM (SELECT ? AS consumer, ? AS dedup_key` + strings.Repeat(` UNION ALL SELECT ?, ?`, n-1) +
				`) AS d STRAIGHT_JOIN {T} AS x ON x.consumer = d.consumer AND x.dedup_key = d.dedup_key`)
			for i := range 2 * n {
				s.Args = append(s.Args, i+1)
			}
			return s
		},
	},

	// The first statement creates the row at "nothing applied"
	// (math.MinInt64, refused as a version) or changes nothing, and locks
	// it either way. In the second a matched row is a changed row, so its
	// count is exact whatever the DSN's clientFoundRows says.
	Versions: VersionsSQL{
		Advance: []SQL{
			q(`INSERT INTO {T} (consumer, entity, version) VALUES (?, ?, -9223372036854775808) ON DUPLICATE KEY UPDATE version = version`, 1, 2),
			q(`UPDATE {T} SET version = ? WHERE consumer = ? AND entity = ? AND version < ?`, 3, 1, 2, 3),
		},
		Last: q(`SELECT version FROM {T} WHERE consumer = ? AND entity = ? AND version > -9223372036854775808`, 1, 2),
	},

	// message_bytes is written with the row: LENGTH(payload), or a
	// generated column, would read every row's BLOB (measured on MariaDB:
	// 8 s for 20 rows of 10 MiB), and so does any locking read (0.8 s for
	// 10), hence a plain read in Claim and the lock in Fetch. The id
	// lists ($1, a JSON array) become a table k(id) that drives
	// primary-key joins: "WHERE id IN (…)" is often planned as a scan,
	// and a scanning DELETE waits on every row it reads, rows claimed by
	// other relays (deadlocks) and uncommitted rows of writers.
	Outbox: OutboxSQL{
		Insert:      q(`INSERT INTO {T} (topic, uuid, payload, metadata, message_bytes) VALUES (?, ?, ?, ?, ?)`, 1, 2, 3, 4, 5),
		InsertValue: func(size int, _ int64) any { return size },
		Claim:       q(`SELECT id, message_bytes FROM {T} FORCE INDEX (PRIMARY) WHERE id > ? ORDER BY id LIMIT ?`, 1, 2),
		Fetch: q(`SELECT o.id, o.topic, o.uuid, o.payload, o.metadata, o.attempts, TIMESTAMPDIFF(MICROSECOND, o.created_at, NOW(6))
FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k STRAIGHT_JOIN {T} AS o ON o.id = k.id FOR UPDATE SKIP LOCKED`, 1),
		IDs:       jsonIDs,
		DeleteIDs: q(`DELETE o FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k STRAIGHT_JOIN {T} AS o ON o.id = k.id`, 1),
		Charge:    q(`UPDATE {T} SET attempts = attempts + 1 WHERE id = ?`, 1),
		DeadLetter: q(`INSERT INTO {D} (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at)
SELECT id, topic, uuid, payload, metadata, attempts + ?, ?, created_at FROM {T} WHERE id = ?`, 2, 3, 1),
		DeleteOne: q(`DELETE FROM {T} WHERE id = ?`, 1),
		Backlog: q(`SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), NOW(6)), 0),
	(SELECT COUNT(*) FROM {D}) FROM {T}`),
		// Times are DATETIME(6) read in the session time zone.
		ListDead: q(`SELECT id, outbox_id, topic, uuid, payload, metadata, attempts, last_error,
	CAST(UNIX_TIMESTAMP(created_at) * 1000000 AS SIGNED), CAST(UNIX_TIMESTAMP(dead_lettered_at) * 1000000 AS SIGNED)
FROM {T} WHERE id > ? AND (? = '' OR topic = ?) ORDER BY id LIMIT ?`, 1, 2, 2, 3),
		CountDead: q(`SELECT COUNT(*) FROM {T}`),
		LockDead: q(`SELECT o.id FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k STRAIGHT_JOIN {T} AS o ON o.id = k.id
ORDER BY o.id FOR UPDATE`, 1),
		CopyDead: q(`INSERT INTO {T} (topic, uuid, payload, metadata, message_bytes)
SELECT o.topic, o.uuid, o.payload, o.metadata, LENGTH(o.payload) + LENGTH(o.metadata) + LENGTH(o.uuid) + LENGTH(o.topic)
FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k STRAIGHT_JOIN {D} AS o ON o.id = k.id ORDER BY o.id`, 1),
		DeleteDead: q(`DELETE o FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k STRAIGHT_JOIN {T} AS o ON o.id = k.id`, 1),
		// Migration 2 looks the columns up in information_schema.
		Renames: func(table string) []string {
			schema, name := "DATABASE()", table
			if i := strings.LastIndexByte(table, '.'); i >= 0 {
				schema, name = "'"+table[:i]+"'", table[i+1:]
			}
			return []string{`'watermill_outbox'`, `'` + name + `'`, `table_schema = DATABASE()`, `table_schema = ` + schema}
		},
	},

	Migrate: MigrateSQL{
		Probe:   q(`SELECT COUNT(*) FROM {T} WHERE 1 = 0`),
		Forget:  q(`DELETE FROM {T} WHERE subject = ?`, 1),
		Applied: q(`SELECT version FROM {T} WHERE subject = ?`, 1),
		Record:  q(`INSERT INTO {T} (subject, version, name) VALUES (?, ?, ?)`, 1, 2, 3),
	},
}

// DATETIME holds years 1000 to 9999; the layout is what MySQL prints for
// DATETIME(6), so strings compare like the times they spell.
const datetimeLayout = "2006-01-02 15:04:05.000000"

// encodeDatetime formats t in UTC for a DATETIME(6) column, truncated to the
// microsecond. Sending the text ourselves (the driver would send text too,
// in the DSN's loc) keeps stored values UTC whatever the DSN says.
func encodeDatetime(t time.Time) (any, error) {
	u := t.UTC()
	if u.Year() < 1000 || u.Year() > 9999 {
		return "", fmt.Errorf("%w: %s is outside the DATETIME range (years 1000 to 9999)", repository.ErrInvalidParams, t)
	}
	return u.Format(datetimeLayout), nil
}

// decodeDatetime reads a DATETIME written by encodeDatetime as UTC, whether the
// driver hands it over as text (parseTime=false) or as a time.Time in the
// DSN's loc (parseTime=true), whose wall clock is the stored UTC value.
func decodeDatetime(v any) (time.Time, error) {
	switch v := v.(type) {
	case time.Time:
		return time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC), nil
	case []byte:
		return time.ParseInLocation("2006-01-02 15:04:05.999999999", string(v), time.UTC)
	}
	return time.Time{}, fmt.Errorf("mysql: cannot scan %T into a timestamp", v)
}
