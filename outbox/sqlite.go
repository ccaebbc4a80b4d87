package outbox

import "github.com/idemkit/watermill-idempotent/internal/sqlstore"

// sqliteFlavor is the outbox on SQLite. It has no row locks and no SKIP
// LOCKED: it has one writer, and the relay's transaction is a write
// transaction from its BEGIN (sqlite.DSN's _txlock=immediate), so what a
// batch reads is its own.
var sqliteFlavor = &flavor{
	sql: &sqlstore.Dialect{Name: "sqlite", Quote: `"`, Bind: sqlstore.QuestionNumbered, QualifyIndex: true},
	// created_at from the process clock in microseconds (SQLite's own has
	// milliseconds), the clock the relay measures ages on.
	insertColumn: "created_at",
	insertValue:  func(_ int, now int64) any { return now },
	processClock: true,
	claim: `SELECT id, length(payload) + length(CAST(metadata AS BLOB)) + length(CAST(uuid AS BLOB)) + length(CAST(topic AS BLOB)) FROM {T}
WHERE id > $1 ORDER BY id LIMIT $2`,
	claimLocks: true,
	fetch:      `SELECT id, topic, uuid, payload, metadata, attempts, $2 - created_at FROM {T} WHERE id IN ` + sqliteIDs,
	ids:        jsonIDs,
	deleteIDs:  `DELETE FROM {T} WHERE id IN ` + sqliteIDs,
	lockIDs:    `SELECT id FROM {T} WHERE id IN ` + sqliteIDs + ` ORDER BY id`,
	copyDead:   `INSERT INTO {T} (topic, uuid, payload, metadata, created_at) SELECT topic, uuid, payload, metadata, $2 FROM {D} WHERE id IN ` + sqliteIDs + ` ORDER BY id`,
	// Timestamps are Unix microseconds of the process clock, $1 in the
	// backlog query.
	age:      func(ts string) string { return `$1 - ` + ts },
	epoch:    func(ts string) string { return ts },
	metadata: "metadata",
}

// sqliteIDs turns a JSON array of ids (jsonIDs, the argument $1) into
// the ids' set.
const sqliteIDs = `(SELECT value FROM json_each($1))`
