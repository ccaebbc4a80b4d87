package outbox

import (
	"strings"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/repository"
)

// postgresFlavor is the outbox on PostgreSQL.
var postgresFlavor = &flavor{
	sql: &sqlstore.Dialect{
		Name: "postgres", Quote: `"`, Bind: sqlstore.Dollar,
		MigrateLock: sqlstore.PostgresMigrateLock,
	},
	// octet_length of a TOASTed bytea reads its stored size without
	// detoasting the payload, so the claim locks the rows (FOR UPDATE
	// SKIP LOCKED) without reading a payload.
	claim: `SELECT id, octet_length(payload)::bigint + octet_length(metadata::text) + octet_length(uuid) + octet_length(topic) FROM {T}
WHERE id > $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`,
	claimLocks: true,
	// Ages are computed by the database, on its clock: the application's
	// may be skewed.
	fetch:     `SELECT id, topic, uuid, payload, metadata, attempts, ` + pgAgeMicros(`created_at`) + ` FROM {T} WHERE id = ANY($1)`,
	ids:       func(ids []int64) any { return ids },
	deleteIDs: `DELETE FROM {T} WHERE id = ANY($1)`,
	// The lock makes the database decide between two concurrent
	// requeues of one row: the second finds it gone.
	lockIDs:  `SELECT id FROM {T} WHERE id = ANY($1) ORDER BY id FOR UPDATE`,
	copyDead: `INSERT INTO {T} (topic, uuid, payload, metadata) SELECT topic, uuid, payload, metadata FROM {D} WHERE id = ANY($1) ORDER BY id`,
	age:      pgAgeMicros,
	epoch: func(ts string) string {
		return `(EXTRACT(EPOCH FROM ` + ts + `) * 1000000)::bigint`
	},
	metadata: `metadata::text`,
	// The trigger's function lives in the table's schema and names its
	// channel.
	renames: func(table string) []string {
		fn := `"` + repository.IndexName(table, "notify") + `"`
		if i := strings.LastIndexByte(table, '.'); i >= 0 {
			fn = `"` + table[:i] + `".` + fn
		}
		return []string{`FUNCTION "` + DefaultTableName + `_notify"`, "FUNCTION " + fn,
			`'` + DefaultTableName + `'`, `'` + notifyChannel(table) + `'`}
	},
}

// pgAgeMicros is the SQL for the microseconds from ts to the start of the
// statement.
func pgAgeMicros(ts string) string {
	return `(EXTRACT(EPOCH FROM statement_timestamp() - ` + ts + `) * 1000000)::bigint`
}
