package outbox

import (
	"strings"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
)

// mysqlFlavor is the outbox on MySQL and MariaDB.
var mysqlFlavor = &flavor{
	sql: &sqlstore.Dialect{
		Name: "mysql", Quote: "`", Bind: sqlstore.Question,
		MigrateLock:   sqlstore.MySQLMigrateLock,
		MigrateUnlock: sqlstore.MySQLMigrateUnlock,
	},
	// message_bytes is written with the row: LENGTH(payload), or a
	// generated column, would read every row's BLOB (measured on MariaDB:
	// 8 s for 20 rows of 10 MiB), and so does any locking read (0.8 s for
	// 10), hence a plain read here and the lock in fetch.
	insertColumn: "message_bytes",
	insertValue:  func(size int, _ int64) any { return size },
	claim:        "SELECT id, message_bytes FROM {T} FORCE INDEX (PRIMARY) WHERE id > $1 ORDER BY id LIMIT $2",
	// The locking read: primary-key lookups only, in id order, so no gap
	// locks and no waits.
	fetch: "SELECT o.id, o.topic, o.uuid, o.payload, o.metadata, o.attempts, TIMESTAMPDIFF(MICROSECOND, o.created_at, NOW(6)) FROM " +
		mysqlIDTable + " STRAIGHT_JOIN {T} AS o ON o.id = k.id FOR UPDATE SKIP LOCKED",
	ids: jsonIDs,
	// Not "WHERE id IN (…)": InnoDB often plans that as a table scan, and
	// a scanning DELETE waits on every row it reads — rows claimed by
	// other relays (deadlocks) and uncommitted rows of writers (a stall
	// until the late transaction ends). Driving the join from the id list
	// makes every row access a primary-key lookup of a row this
	// transaction already holds.
	deleteIDs: "DELETE o FROM " + mysqlIDTable + " STRAIGHT_JOIN {T} AS o ON o.id = k.id",
	lockIDs:   "SELECT o.id FROM " + mysqlIDTable + " STRAIGHT_JOIN {T} AS o ON o.id = k.id ORDER BY o.id FOR UPDATE",
	copyDead: "INSERT INTO {T} (topic, uuid, payload, metadata, message_bytes) SELECT o.topic, o.uuid, o.payload, o.metadata," +
		" LENGTH(o.payload) + LENGTH(o.metadata) + LENGTH(o.uuid) + LENGTH(o.topic) FROM " +
		mysqlIDTable + " STRAIGHT_JOIN {D} AS o ON o.id = k.id ORDER BY o.id",
	age: func(ts string) string { return "TIMESTAMPDIFF(MICROSECOND, " + ts + ", NOW(6))" },
	// A DATETIME(6) read in the session time zone.
	epoch:    func(ts string) string { return "CAST(UNIX_TIMESTAMP(" + ts + ") * 1000000 AS SIGNED)" },
	metadata: "metadata",
	// Migration 2 looks the columns up in information_schema.
	renames: func(table string) []string {
		schema, name := "DATABASE()", table
		if i := strings.LastIndexByte(table, '.'); i >= 0 {
			schema, name = "'"+table[:i]+"'", table[i+1:]
		}
		return []string{`'` + DefaultTableName + `'`, `'` + name + `'`,
			`table_schema = DATABASE()`, `table_schema = ` + schema}
	},
}

// mysqlIDTable turns a JSON array of ids (jsonIDs, the argument $1) into
// a table k(id) to drive a primary-key join.
const mysqlIDTable = "JSON_TABLE($1, '$[*]' COLUMNS (id BIGINT PATH '$')) AS k"
