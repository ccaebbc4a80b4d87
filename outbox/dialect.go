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

// flavors are the outbox's dialects.
var flavors = map[Dialect]*flavor{PostgreSQL: postgresFlavor, MySQL: mysqlFlavor, SQLite: sqliteFlavor}

// migrationLine is the outbox's migration line for dialect kind: the
// files in Migrations, recorded as "outbox:<table>" in the stores'
// migrations table, under the stores' lock.
func migrationLine(kind Dialect) sqlstore.Line {
	f := flavors[kind]
	q := f.sql.Quote
	return sqlstore.Line{
		Dialect: f.sql,
		FS:      Migrations,
		Dir:     "migrations/" + string(kind),
		Name:    "outbox",
		Default: DefaultTableName,
		Extra: func(table string) []string {
			dead, _ := repository.QuoteTableName(DeadLetterTableName(table), q)
			pairs := []string{q + DeadLetterTableName(DefaultTableName) + q, dead}
			if f.renames != nil {
				pairs = append(pairs, f.renames(table)...)
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
// limit, a prefix of it with a hash of the table's own name (never equal
// to table). A schema qualifier is kept and left out of the hash, so
// "t" and "public.t" name one dead-letter table wherever they name one
// outbox table. Migrate creates it; the shipped SQL files include it.
func DeadLetterTableName(table string) string {
	schema, name := "", table
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		schema, name = table[:i+1], table[i+1:]
	}
	const suffix = "_dead_letters"
	if len(name)+len(suffix) <= 63 {
		return schema + name + suffix
	}
	sum := sha256.Sum256([]byte(name))
	h := "_dl_" + hex.EncodeToString(sum[:8]) // 20 bytes
	return schema + name[:63-len(h)] + h
}

// flavor is an outbox dialect: what differs between the databases, the
// real differences only. Statements use {T} for the table they act on,
// {D} for the dead-letter table and $n for the n-th argument; the
// statements all databases share are in newDialect.
type flavor struct {
	// sql quotes, binds placeholders and takes the migration lock, the
	// one the stores of repository/postgres and repository/mysql take.
	sql *sqlstore.Dialect
	// insertColumn is a column the INSERT fills besides topic, uuid,
	// payload and metadata, with insertValue(message size, now in Unix
	// microseconds); "": none.
	insertColumn string
	insertValue  func(size int, nowMicros int64) any
	// processClock: the tables' timestamps are the process clock's (Unix
	// microseconds), so a dead letter's dead_lettered_at is written by
	// the relay too.
	processClock bool
	// claim returns the ids and sizes, not the payloads, of up to $2 rows
	// after id $1 in id order, so a batch can be bounded by bytes before
	// any payload is read; fetch then reads the rows that fit. claimLocks:
	// claim takes the rows (PostgreSQL's FOR UPDATE SKIP LOCKED; SQLite's
	// exclusive write transaction); otherwise fetch locks the rows it
	// reads, skipping rows other relays hold.
	claim      string
	claimLocks bool
	// fetch reads the rows whose ids are in $1 ($2: the relay's clock in
	// Unix microseconds) with their ages in microseconds, in no
	// particular order.
	fetch string
	// ids encodes an id list as the argument of fetch, deleteIDs,
	// lockIDs and copyDead.
	ids func([]int64) any
	// deleteIDs deletes the rows of {T} whose ids are in $1.
	deleteIDs string
	// lockIDs locks and returns the rows of {T} whose ids are in $1;
	// copyDead copies the dead letters whose ids are in $1 into {T} as
	// new rows ($2: the relay's clock), in id order.
	lockIDs, copyDead string
	// age is the SQL of the microseconds from ts to now ($1: the relay's
	// clock, for databases that keep the process's); epoch of ts as
	// microseconds since the Unix epoch; metadata the metadata column as
	// text.
	age, epoch func(ts string) string
	metadata   string
	// renames returns replacement pairs for names in the migration files
	// other than the tables and their indexes (see sqlstore.Line.Extra).
	renames func(table string) []string
}

// dialect holds a flavor's statements bound for one table.
type dialect struct {
	f       *flavor
	table   string // quoted
	channel string // PostgreSQL NOTIFY channel

	claim, fetch, deleteAcked              sqlstore.Stmt
	charge, deadLetter, deleteOne, backlog sqlstore.Stmt
	listDead, countDead                    sqlstore.Stmt
	lockDead, copyDead, deleteDead         sqlstore.Stmt
}

// newDialect binds kind's statements for table, a validated name.
func newDialect(kind Dialect, table string) dialect {
	f := flavors[kind]
	d := dialect{f: f, channel: notifyChannel(table)}
	d.table, _ = repository.QuoteTableName(table, f.sql.Quote)
	dead, _ := repository.QuoteTableName(DeadLetterTableName(table), f.sql.Quote)
	on := func(t, query string) sqlstore.Stmt {
		return f.sql.Statement(t, strings.ReplaceAll(query, "{D}", dead))
	}
	d.claim = on(d.table, f.claim)
	d.fetch = on(d.table, f.fetch)
	d.deleteAcked = on(d.table, f.deleteIDs)
	d.charge = on(d.table, `UPDATE {T} SET attempts = attempts + 1 WHERE id = $1`)
	// A claimed row is copied with its attempts raised by $2 and its last
	// error, then deleted, in one transaction.
	stampCol, stamp := "", ""
	if f.processClock {
		stampCol, stamp = ", dead_lettered_at", ", $4"
	}
	d.deadLetter = on(d.table, `INSERT INTO {D} (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at`+stampCol+`)
SELECT id, topic, uuid, payload, metadata, attempts + $2, $3, created_at`+stamp+` FROM {T} WHERE id = $1`)
	d.deleteOne = on(d.table, `DELETE FROM {T} WHERE id = $1`)
	d.backlog = on(d.table, `SELECT COUNT(*), COALESCE(`+f.age(`MIN(created_at)`)+`, 0), (SELECT COUNT(*) FROM {D}) FROM {T}`)
	d.listDead = on(dead, `SELECT id, outbox_id, topic, uuid, payload, `+f.metadata+`, attempts, last_error, `+
		f.epoch(`created_at`)+`, `+f.epoch(`dead_lettered_at`)+` FROM {T} WHERE id > $1 AND ($2 = '' OR topic = $2) ORDER BY id LIMIT $3`)
	d.countDead = on(dead, `SELECT COUNT(*) FROM {T}`)
	d.lockDead = on(dead, f.lockIDs)
	d.copyDead = on(d.table, f.copyDead)
	d.deleteDead = on(dead, f.deleteIDs)
	return d
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

// insertQuery builds one multi-row INSERT; msgs are validated already.
func (d dialect) insertQuery(msgs []Outgoing) (wsql.Query, error) {
	var b strings.Builder
	b.WriteString(`INSERT INTO ` + d.table + ` (topic, uuid, payload, metadata`)
	cols := 4
	if d.f.insertColumn != "" {
		b.WriteString(", " + d.f.insertColumn)
		cols++
	}
	b.WriteString(") VALUES ")
	args := make([]any, 0, cols*len(msgs))
	now := time.Now().UnixMicro()
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := range cols {
			if c > 0 {
				b.WriteByte(',')
			}
			b.WriteString(d.f.sql.Placeholder(cols*i + c + 1))
		}
		b.WriteByte(')')
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
		if d.f.insertColumn != "" {
			args = append(args, d.f.insertValue(len(payload)+len(md)+len(m.Message.UUID)+len(m.Topic), now))
		}
	}
	return wsql.Query{Query: b.String(), Args: args}, nil
}

// jsonIDs encodes ids as a JSON array.
func jsonIDs(ids []int64) any {
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

// requeue moves the dead letters ids back into the outbox inside tx:
// lock them, copy them, delete them. The lock makes the database decide
// between two concurrent requeues of one row: the second finds it gone.
func (d dialect) requeue(ctx context.Context, tx sqlstore.Executor, ids []int64) (int, error) {
	rows, err := tx.Query(ctx, d.lockDead.SQL(), d.lockDead.Args(d.f.ids(ids))...)
	if err != nil {
		return 0, err
	}
	var locked []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return 0, err
		}
		locked = append(locked, id)
	}
	if err := rows.Close(); err != nil {
		return 0, err
	}
	if len(locked) == 0 {
		return 0, nil
	}
	if _, err := tx.Exec(ctx, d.copyDead.SQL(), d.copyDead.Args(d.f.ids(locked), time.Now().UnixMicro())...); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, d.deleteDead.SQL(), d.deleteDead.Args(d.f.ids(locked))...); err != nil {
		return 0, err
	}
	return len(locked), nil
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
