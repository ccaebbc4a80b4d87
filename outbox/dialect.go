package outbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Migrations holds the outbox's schema as numbered migration files, one
// folder per dialect (postgres/, mysql/, sqlite/), written for
// DefaultTableName: Migrate applies them, and so can golang-migrate. They
// live in this package, not beside the stores' files in
// repository/<backend>/migrations, so that importing the outbox pulls in
// no store and no driver.
//
//go:embed migrations
var Migrations embed.FS

// PostgresSchemaSQL is the PostgreSQL DDL for DefaultTableName: the up
// migrations of migrations/postgres, in order.
var PostgresSchemaSQL = mustReadMigrations(PostgreSQL)

// MySQLSchemaSQL is the MySQL/MariaDB DDL for DefaultTableName: the up
// migrations of migrations/mysql, in order.
var MySQLSchemaSQL = mustReadMigrations(MySQL)

// SQLiteSchemaSQL is the SQLite DDL for DefaultTableName: the up
// migrations of migrations/sqlite, in order.
var SQLiteSchemaSQL = mustReadMigrations(SQLite)

func mustReadMigrations(d Dialect) string {
	ddl, err := migrationLine(d).DDL(DefaultTableName)
	if err != nil {
		panic(err)
	}
	return ddl
}

// migrationDialects carry what the migration runner needs of each
// dialect: quoting, placeholders and the lock, the same lock the stores
// of repository/postgres and repository/mysql take (SQLite: its single
// writer), so outbox and store migrations never run at once.
var migrationDialects = map[Dialect]*sqlstore.Dialect{
	PostgreSQL: {
		Name: "postgres", Quote: `"`, Bind: sqlstore.Dollar,
		MigrateLock: sqlstore.PostgresMigrateLock,
	},
	MySQL: {
		Name: "mysql", Quote: "`", Bind: sqlstore.Question,
		MigrateLock:   sqlstore.MySQLMigrateLock,
		MigrateUnlock: sqlstore.MySQLMigrateUnlock,
	},
	SQLite: {Name: "sqlite", Quote: `"`, Bind: sqlstore.QuestionNumbered, QualifyIndex: true},
}

// migrationLine is the outbox's migration line for dialect kind: the
// files in Migrations, recorded as "outbox:<table>" in the stores'
// migrations table.
func migrationLine(kind Dialect) sqlstore.Line {
	q := migrationDialects[kind].Quote
	return sqlstore.Line{
		Dialect: migrationDialects[kind],
		FS:      Migrations,
		Dir:     "migrations/" + string(kind),
		Name:    "outbox",
		Default: DefaultTableName,
		Extra: func(table string) []string {
			dead, _ := repository.QuoteTableName(DeadLetterTableName(table), q)
			pairs := []string{q + DeadLetterTableName(DefaultTableName) + q, dead}
			if kind == MySQL {
				// Migration 2 looks the columns up in information_schema.
				schema, name := "DATABASE()", table
				if i := strings.LastIndexByte(table, '.'); i >= 0 {
					schema, name = "'"+table[:i]+"'", table[i+1:]
				}
				pairs = append(pairs, `'`+DefaultTableName+`'`, `'`+name+`'`,
					`table_schema = DATABASE()`, `table_schema = `+schema)
			}
			if kind == PostgreSQL {
				fn := `"` + repository.IndexName(table, "notify") + `"`
				if i := strings.LastIndexByte(table, '.'); i >= 0 {
					fn = `"` + table[:i] + `".` + fn
				}
				pairs = append(pairs, `FUNCTION "`+DefaultTableName+`_notify"`, "FUNCTION "+fn,
					`'`+DefaultTableName+`'`, `'`+notifyChannel(table)+`'`)
			}
			return pairs
		},
	}
}

// The databases cap a statement at 32,766 (SQLite) or 65,535
// placeholders; four per row (five on MySQL).
const maxRowsPerInsert = 1000

// SchemaDDL returns the statements Migrate runs for dialect and table, for
// callers who apply schema with their own migration tool. It returns ""
// for an unknown dialect or an invalid table name.
func SchemaDDL(d Dialect, table string) string {
	if (Config{Dialect: d, Table: table}).Validate() != nil {
		return ""
	}
	ddl, err := migrationLine(d).DDL(table)
	if err != nil {
		return ""
	}
	return ddl
}

// DeadLetterTableName returns the dead-letter table of an outbox table:
// table + "_dead_letters", or, when that exceeds the 63-byte identifier
// limit, a prefix of it with a hash of the whole name (never equal to
// table). A schema qualifier is kept. Migrate creates it; the shipped SQL
// files include it.
func DeadLetterTableName(table string) string {
	schema, name := "", table
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		schema, name = table[:i+1], table[i+1:]
	}
	const suffix = "_dead_letters"
	if len(name)+len(suffix) <= 63 {
		return schema + name + suffix
	}
	sum := sha256.Sum256([]byte(table))
	h := "_dl_" + hex.EncodeToString(sum[:8]) // 20 bytes
	return schema + name[:63-len(h)] + h
}

// dialect holds the statements for one table in one SQL flavour, built
// once from a validated table name.
type dialect struct {
	kind      Dialect
	table     string // quoted
	deadTable string // quoted dead-letter table
	channel   string // PostgreSQL NOTIFY channel

	// claimSQL returns the ids and sizes, not the payloads, of the next
	// rows in id order after an id, so a batch can be bounded by bytes
	// before any payload is read; fetchQuery then reads the rows that
	// fit. On PostgreSQL claimSQL takes the row locks (FOR UPDATE SKIP
	// LOCKED; it never reads a TOASTed payload). On MySQL a locking read
	// fetches whole rows, BLOBs included, whatever the select list, so
	// claimSQL is a plain read and fetchQuery locks (SKIP LOCKED) the
	// rows it reads. SQLite has no row locks and no SKIP LOCKED: it has
	// one writer, and the relay's transaction is a write transaction
	// from its BEGIN (sqlite.DSN's _txlock=immediate), so a batch is
	// exclusive; claimSQL is a plain read there too.
	claimSQL   string
	claimLocks bool
	backlogSQL string
	// chargeSQL counts one failed publish attempt of a row.
	chargeSQL string
	// deadLetterSQL copies a claimed row into the dead-letter table with
	// its attempts raised by the second argument and the last error;
	// deleteOneSQL then removes it, in the same transaction.
	deadLetterSQL string
	deleteOneSQL  string
	// Operator statements on the dead-letter table.
	listDeadSQL    string
	countDeadSQL   string
	requeueDeadSQL string // PostgreSQL: one statement; MySQL: see requeue
}

func newDialect(kind Dialect, table string) dialect {
	d := dialect{kind: kind}
	dead := DeadLetterTableName(table)
	switch kind {
	case PostgreSQL:
		d.table, _ = repository.QuoteTableName(table, `"`)
		d.deadTable, _ = repository.QuoteTableName(dead, `"`)
		d.channel = notifyChannel(table)
		// octet_length of a TOASTed bytea reads its stored size without
		// detoasting the payload.
		d.claimSQL = `SELECT id, octet_length(payload)::bigint + octet_length(metadata::text) + octet_length(uuid) + octet_length(topic) FROM ` + d.table +
			` WHERE id > $1 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED`
		d.claimLocks = true
		// Ages are computed by the database, on its clock, in
		// microseconds: the application's clock may be skewed.
		d.backlogSQL = `SELECT COUNT(*), COALESCE(` + pgAgeMicros(`MIN(created_at)`) + `, 0), (SELECT COUNT(*) FROM ` + d.deadTable + `) FROM ` + d.table
		d.chargeSQL = `UPDATE ` + d.table + ` SET attempts = attempts + 1 WHERE id = $1`
		d.deadLetterSQL = `INSERT INTO ` + d.deadTable + ` (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at)
SELECT id, topic, uuid, payload, metadata, attempts + $2, $3, created_at FROM ` + d.table + ` WHERE id = $1`
		d.deleteOneSQL = `DELETE FROM ` + d.table + ` WHERE id = $1`
		d.listDeadSQL = `SELECT id, outbox_id, topic, uuid, payload, metadata::text, attempts, last_error, ` +
			pgEpochMicros(`created_at`) + `, ` + pgEpochMicros(`dead_lettered_at`) + ` FROM ` + d.deadTable +
			` WHERE id > $1 AND ($2 = '' OR topic = $2) ORDER BY id LIMIT $3`
		d.countDeadSQL = `SELECT COUNT(*) FROM ` + d.deadTable
		// One statement: the DELETE locks the rows, so of two concurrent
		// requeues of one row the second finds nothing to move.
		d.requeueDeadSQL = `WITH moved AS (DELETE FROM ` + d.deadTable + ` WHERE id = ANY($1) RETURNING id, topic, uuid, payload, metadata)
INSERT INTO ` + d.table + ` (topic, uuid, payload, metadata) SELECT topic, uuid, payload, metadata FROM moved ORDER BY id`
	case MySQL:
		d.table, _ = repository.QuoteTableName(table, "`")
		d.deadTable, _ = repository.QuoteTableName(dead, "`")
		// message_bytes is written with the row: LENGTH(payload), or a
		// generated column, would read every row's BLOB (measured on
		// MariaDB: 8 s for 20 rows of 10 MiB), and so does any locking
		// read (0.8 s for 10), hence the plain read; see claimSQL.
		d.claimSQL = "SELECT `id`, `message_bytes` FROM " + d.table +
			" FORCE INDEX (PRIMARY) WHERE `id` > ? ORDER BY `id` LIMIT ?"
		d.backlogSQL = "SELECT COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(`created_at`), NOW(6)), 0), (SELECT COUNT(*) FROM " + d.deadTable + ") FROM " + d.table
		d.chargeSQL = "UPDATE " + d.table + " SET `attempts` = `attempts` + 1 WHERE `id` = ?"
		d.deadLetterSQL = "INSERT INTO " + d.deadTable + " (`outbox_id`, `topic`, `uuid`, `payload`, `metadata`, `attempts`, `last_error`, `created_at`)" +
			" SELECT `id`, `topic`, `uuid`, `payload`, `metadata`, `attempts` + ?, ?, `created_at` FROM " + d.table + " WHERE `id` = ?"
		d.deleteOneSQL = "DELETE FROM " + d.table + " WHERE `id` = ?"
		d.listDeadSQL = "SELECT `id`, `outbox_id`, `topic`, `uuid`, `payload`, `metadata`, `attempts`, `last_error`, " +
			mysqlEpochMicros("`created_at`") + ", " + mysqlEpochMicros("`dead_lettered_at`") + " FROM " + d.deadTable +
			" WHERE `id` > ? AND (? = '' OR `topic` = ?) ORDER BY `id` LIMIT ?"
		d.countDeadSQL = "SELECT COUNT(*) FROM " + d.deadTable
	case SQLite:
		d.table, _ = repository.QuoteTableName(table, `"`)
		d.deadTable, _ = repository.QuoteTableName(dead, `"`)
		// The relay's write transaction is exclusive (see claimSQL):
		// what it reads is claimed.
		d.claimSQL = `SELECT id, length(payload) + length(CAST(metadata AS BLOB)) + length(CAST(uuid AS BLOB)) + length(CAST(topic AS BLOB)) FROM ` + d.table +
			` WHERE id > ?1 ORDER BY id LIMIT ?2`
		d.claimLocks = true
		d.backlogSQL = `SELECT COUNT(*), COALESCE(` + sqliteNowMicros + ` - MIN(created_at), 0), (SELECT COUNT(*) FROM ` + d.deadTable + `) FROM ` + d.table
		d.chargeSQL = `UPDATE ` + d.table + ` SET attempts = attempts + 1 WHERE id = ?1`
		d.deadLetterSQL = `INSERT INTO ` + d.deadTable + ` (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at)
SELECT id, topic, uuid, payload, metadata, attempts + ?2, ?3, created_at FROM ` + d.table + ` WHERE id = ?1`
		d.deleteOneSQL = `DELETE FROM ` + d.table + ` WHERE id = ?1`
		d.listDeadSQL = `SELECT id, outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at, dead_lettered_at FROM ` + d.deadTable +
			` WHERE id > ?1 AND (?2 = '' OR topic = ?2) ORDER BY id LIMIT ?3`
		d.countDeadSQL = `SELECT COUNT(*) FROM ` + d.deadTable
	}
	return d
}

// sqliteNowMicros is the SQL for the current time as Unix microseconds
// (julianday has millisecond precision), the unit of the SQLite tables'
// timestamps.
const sqliteNowMicros = `CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)`

// sqliteIDs turns a JSON array of ids (jsonIDs, the one argument) into
// the ids' set.
const sqliteIDs = `(SELECT value FROM json_each(?1))`

// pgEpochMicros is the SQL for a timestamptz as microseconds since the
// Unix epoch.
func pgEpochMicros(ts string) string {
	return `(EXTRACT(EPOCH FROM ` + ts + `) * 1000000)::bigint`
}

// mysqlEpochMicros is the SQL for a DATETIME(6), read in the session time
// zone, as microseconds since the Unix epoch.
func mysqlEpochMicros(ts string) string {
	return "CAST(UNIX_TIMESTAMP(" + ts + ") * 1000000 AS SIGNED)"
}

// pgAgeMicros is the SQL for the microseconds from ts to the start of the
// statement.
func pgAgeMicros(ts string) string {
	return `(EXTRACT(EPOCH FROM statement_timestamp() - ` + ts + `) * 1000000)::bigint`
}

// notifyChannel is the table name when it fits PostgreSQL's 63-byte
// identifier limit, else a prefix of it with a hash of the whole name.
func notifyChannel(table string) string {
	if len(table) <= 63 {
		return table
	}
	sum := sha256.Sum256([]byte(table))
	return table[:46] + "_" + hex.EncodeToString(sum[:8])
}

// placeholder returns the n-th (1-based) bind marker.
func (d dialect) placeholder(n int) string {
	if d.kind == PostgreSQL {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// insertQuery builds one multi-row INSERT; msgs are validated already.
func (d dialect) insertQuery(msgs []Outgoing) (wsql.Query, error) {
	var b strings.Builder
	switch d.kind {
	case PostgreSQL:
		b.WriteString(`INSERT INTO ` + d.table + ` (topic, uuid, payload, metadata) VALUES `)
	case SQLite:
		// created_at from the process clock in microseconds (SQLite's
		// own has milliseconds), the clock the relay measures ages on.
		b.WriteString(`INSERT INTO ` + d.table + ` (topic, uuid, payload, metadata, created_at) VALUES `)
	default:
		b.WriteString("INSERT INTO " + d.table + " (`topic`, `uuid`, `payload`, `metadata`, `message_bytes`) VALUES ")
	}
	args := make([]any, 0, 5*len(msgs))
	now := time.Now().UnixMicro()
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		if d.kind == PostgreSQL {
			n := 4 * i
			fmt.Fprintf(&b, "(%s,%s,%s,%s)", d.placeholder(n+1), d.placeholder(n+2), d.placeholder(n+3), d.placeholder(n+4))
		} else {
			b.WriteString("(?,?,?,?,?)")
		}
		md := []byte("{}")
		if len(m.Message.Metadata) > 0 {
			var err error
			if md, err = json.Marshal(m.Message.Metadata); err != nil {
				return wsql.Query{}, fmt.Errorf("outbox: encode metadata of message %s: %w", m.Message.UUID, err)
			}
		}
		payload := []byte(m.Message.Payload)
		if payload == nil {
			payload = []byte{} // the column is NOT NULL; an empty payload stays empty
		}
		args = append(args, m.Topic, m.Message.UUID, payload, string(md))
		switch d.kind {
		case MySQL:
			args = append(args, len(payload)+len(md)+len(m.Message.UUID)+len(m.Topic))
		case SQLite:
			args = append(args, now)
		}
	}
	return wsql.Query{Query: b.String(), Args: args}, nil
}

// deleteQuery acknowledges published rows by primary key.
func (d dialect) deleteQuery(ids []int64) (string, []any) {
	switch d.kind {
	case PostgreSQL:
		return `DELETE FROM ` + d.table + ` WHERE id = ANY($1)`, []any{ids}
	case SQLite:
		return `DELETE FROM ` + d.table + ` WHERE id IN ` + sqliteIDs, []any{jsonIDs(ids)}
	}
	// Not "WHERE id IN (…)": InnoDB often plans that as a table scan, and
	// a scanning DELETE waits on every row it reads — rows claimed by
	// other relays (deadlocks) and uncommitted rows of writers (a stall
	// until the late transaction ends). Driving the join from the id list
	// makes every row access a primary-key lookup of a row this
	// transaction already holds.
	return "DELETE o FROM " + mysqlIDTable + " STRAIGHT_JOIN " + d.table +
		" AS o ON o.`id` = k.`id`", []any{jsonIDs(ids)}
}

// mysqlIDTable turns a JSON array of ids (the one argument) into a table
// k(id) to drive a primary-key join; see deleteQuery.
const mysqlIDTable = "JSON_TABLE(?, '$[*]' COLUMNS (`id` BIGINT PATH '$')) AS k"

// jsonIDs encodes ids as a JSON array for mysqlIDTable.
func jsonIDs(ids []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte(']')
	return b.String()
}

// fetchQuery reads the rows ids, in no particular order: on PostgreSQL
// rows claimSQL locked; on MySQL it locks them, skipping rows another
// relay holds (primary-key lookups only, in id order, so no gap locks
// and no waits). Ages are taken at the statement's start on the database
// clock, except on SQLite, whose clock is the process's: there they are
// taken at now, the relay's claimStart, to the microsecond.
func (d dialect) fetchQuery(ids []int64, now time.Time) (string, []any) {
	if d.kind == PostgreSQL {
		return `SELECT id, topic, uuid, payload, metadata, attempts, ` + pgAgeMicros(`created_at`) + ` FROM ` + d.table +
			` WHERE id = ANY($1)`, []any{ids}
	}
	if d.kind == SQLite {
		return `SELECT id, topic, uuid, payload, metadata, attempts, ?2 - created_at FROM ` + d.table +
			` WHERE id IN ` + sqliteIDs, []any{jsonIDs(ids), now.UnixMicro()}
	}
	return "SELECT o.`id`, o.`topic`, o.`uuid`, o.`payload`, o.`metadata`, o.`attempts`, TIMESTAMPDIFF(MICROSECOND, o.`created_at`, NOW(6)) FROM " +
		mysqlIDTable + " STRAIGHT_JOIN " + d.table + " AS o ON o.`id` = k.`id` FOR UPDATE SKIP LOCKED", []any{jsonIDs(ids)}
}

// deadLetterArgs are deadLetterSQL's arguments: the row, the attempts to
// add to its count, the last error.
func (d dialect) deadLetterArgs(id int64, addAttempts int, lastError string) []any {
	if d.kind == MySQL {
		return []any{addAttempts, lastError, id}
	}
	return []any{id, addAttempts, lastError}
}

// deleteDeadQuery deletes dead letters by id.
func (d dialect) deleteDeadQuery(ids []int64) (string, []any) {
	switch d.kind {
	case PostgreSQL:
		return `DELETE FROM ` + d.deadTable + ` WHERE id = ANY($1)`, []any{ids}
	case SQLite:
		return `DELETE FROM ` + d.deadTable + ` WHERE id IN ` + sqliteIDs, []any{jsonIDs(ids)}
	}
	return "DELETE o FROM " + mysqlIDTable + " STRAIGHT_JOIN " + d.deadTable +
		" AS o ON o.`id` = k.`id`", []any{jsonIDs(ids)}
}

// requeueMySQL moves dead letters ids back into the outbox inside tx, in
// three statements (MySQL has no DELETE … RETURNING): lock the rows, copy
// them, delete them. The lock makes the database decide between two
// concurrent requeues of one row: the second finds it gone.
func (d dialect) requeueMySQL(ctx context.Context, tx sqlstore.Executor, ids []int64) (int, error) {
	rows, err := tx.Query(ctx, "SELECT o.`id` FROM "+mysqlIDTable+" STRAIGHT_JOIN "+d.deadTable+
		" AS o ON o.`id` = k.`id` ORDER BY o.`id` FOR UPDATE", jsonIDs(ids))
	if err != nil {
		return 0, err
	}
	var locked []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		locked = append(locked, id)
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	rows.Close()
	if len(locked) == 0 {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+d.table+" (`topic`, `uuid`, `payload`, `metadata`, `message_bytes`)"+
		" SELECT o.`topic`, o.`uuid`, o.`payload`, o.`metadata`, LENGTH(o.`payload`) + LENGTH(o.`metadata`) + LENGTH(o.`uuid`) + LENGTH(o.`topic`) FROM "+
		mysqlIDTable+" STRAIGHT_JOIN "+d.deadTable+" AS o ON o.`id` = k.`id` ORDER BY o.`id`", jsonIDs(locked)); err != nil {
		return 0, err
	}
	q, args := d.deleteDeadQuery(locked)
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return 0, err
	}
	return len(locked), nil
}

// requeueSQLite moves dead letters ids back into the outbox inside tx:
// copy, then delete. The transaction is a write transaction from its
// BEGIN (see claimSQL), so no other requeue runs between the two.
func (d dialect) requeueSQLite(ctx context.Context, tx sqlstore.Executor, ids []int64) (int, error) {
	n, err := tx.Exec(ctx, `INSERT INTO `+d.table+` (topic, uuid, payload, metadata)
SELECT topic, uuid, payload, metadata FROM `+d.deadTable+` WHERE id IN `+sqliteIDs+` ORDER BY id`, jsonIDs(ids))
	if err != nil || n == 0 {
		return 0, err
	}
	q, args := d.deleteDeadQuery(ids)
	if _, err := tx.Exec(ctx, q, args...); err != nil {
		return 0, err
	}
	return int(n), nil
}

// schemaAdapter lets watermill-sql's Publisher write into the outbox
// table. It only writes: the table is read by Relay, whose claim-by-row
// design does not fit watermill-sql's offset-based subscriber (see
// docs/outbox.md), so the adapter is unexported and its read methods are
// never reached.
type schemaAdapter struct{ d dialect }

var _ wsql.SchemaAdapter = schemaAdapter{}

// InsertQuery validates msgs and inserts them for topic.
func (a schemaAdapter) InsertQuery(topic string, msgs message.Messages) (wsql.Query, error) {
	if len(msgs) > maxRowsPerInsert*10 {
		return wsql.Query{}, fmt.Errorf("%w: %d messages in one Publish, at most %d", ErrInvalidMessage, len(msgs), maxRowsPerInsert*10)
	}
	out := make([]Outgoing, len(msgs))
	for i, m := range msgs {
		if err := validateOutgoing(topic, m); err != nil {
			return wsql.Query{}, err
		}
		out[i] = Outgoing{Topic: topic, Message: m}
	}
	if len(out) == 0 {
		// Publish(topic) without messages writes nothing, like WriteTx.
		return wsql.Query{Query: "SELECT 1"}, nil
	}
	return a.d.insertQuery(out)
}

// SchemaInitializingQueries returns nothing: the schema is created by
// Migrate, never by the publisher inside a caller's transaction.
func (a schemaAdapter) SchemaInitializingQueries(string) []wsql.Query { return nil }

// SelectQuery is not used; see the type comment.
func (a schemaAdapter) SelectQuery(string, string, wsql.OffsetsAdapter) wsql.Query {
	return wsql.Query{}
}

// UnmarshalMessage is not used; see the type comment.
func (a schemaAdapter) UnmarshalMessage(wsql.Scanner) (wsql.Row, error) {
	return wsql.Row{}, fmt.Errorf("outbox: the outbox table is read by outbox.Relay, not by a watermill-sql subscriber")
}

// SubscribeIsolationLevel is not used; see the type comment.
func (a schemaAdapter) SubscribeIsolationLevel() sql.IsolationLevel { return sql.LevelReadCommitted }
