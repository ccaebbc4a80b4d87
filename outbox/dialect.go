package outbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
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

// migrationLine is the outbox's migration line for dialect kind: the
// files in Migrations, recorded as "outbox:<table>" in the stores'
// migrations table, under the stores' lock.
func migrationLine(kind sqldialect.Dialect) sqlstore.Line {
	d := sqlstore.Of(string(kind))
	q := d.Quote
	return sqlstore.Line{
		Dialect: d,
		FS:      Migrations,
		Dir:     "migrations/" + string(kind),
		Name:    "outbox",
		Default: DefaultTableName,
		Extra: func(table string) []string {
			dead, _ := repository.QuoteTableName(DeadLetterTableName(table), q)
			pairs := []string{q + DeadLetterTableName(DefaultTableName) + q, dead}
			if d.Outbox.Renames != nil {
				pairs = append(pairs, d.Outbox.Renames(table)...)
			}
			return pairs
		},
	}
}

// The databases cap a statement at 32,766 (SQLite) or 65,535
// placeholders; four per row (five on MySQL).
const maxRowsPerInsert = 1000

// schemaDDL returns the statements Migrate runs for dialect and table, or
// "" for an unknown dialect or an invalid table name.
func schemaDDL(d sqldialect.Dialect, table string) string {
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

// dialect holds a database's outbox statements bound for one table.
type dialect struct {
	sql     *sqlstore.Dialect
	table   string // quoted
	channel string // PostgreSQL NOTIFY channel

	claim, fetch, deleteAcked              sqlstore.Stmt
	charge, deadLetter, deleteOne, backlog sqlstore.Stmt
	listDead, countDead                    sqlstore.Stmt
	lockDead, copyDead, deleteDead         sqlstore.Stmt
}

// newDialect binds kind's statements for table, a validated name.
func newDialect(kind sqldialect.Dialect, table string) dialect {
	sd := sqlstore.Of(string(kind))
	d := dialect{sql: sd, channel: sqlstore.NotifyChannel(table)}
	d.table, _ = repository.QuoteTableName(table, sd.Quote)
	dead, _ := repository.QuoteTableName(DeadLetterTableName(table), sd.Quote)
	on := func(t string, s sqlstore.SQL) sqlstore.Stmt {
		s.Text = strings.ReplaceAll(s.Text, "{D}", dead)
		return sd.Bound(t, s)
	}
	o := &sd.Outbox
	d.claim, d.fetch, d.deleteAcked = on(d.table, o.Claim), on(d.table, o.Fetch), on(d.table, o.DeleteIDs)
	d.charge, d.deadLetter, d.deleteOne = on(d.table, o.Charge), on(d.table, o.DeadLetter), on(d.table, o.DeleteOne)
	d.backlog, d.copyDead = on(d.table, o.Backlog), on(d.table, o.CopyDead)
	d.listDead, d.countDead, d.lockDead, d.deleteDead = on(dead, o.ListDead), on(dead, o.CountDead), on(dead, o.LockDead), on(dead, o.DeleteDead)
	return d
}

// insertQuery builds one multi-row INSERT; msgs are validated already.
func (d dialect) insertQuery(msgs []Outgoing) (wsql.Query, error) {
	o := &d.sql.Outbox
	cols := 4
	if o.InsertValue != nil {
		cols++
	}
	st := d.sql.Bound(d.table, d.sql.Repeat(o.Insert, len(msgs), cols))
	args := make([]any, 0, cols*len(msgs))
	now := time.Now().UnixMicro()
	for _, m := range msgs {
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
		if o.InsertValue != nil {
			args = append(args, o.InsertValue(len(payload)+len(md)+len(m.Message.UUID)+len(m.Topic), now))
		}
	}
	return wsql.Query{Query: st.SQL(), Args: st.Args(args...)}, nil
}

// requeue moves the dead letters ids back into the outbox inside tx:
// lock them, copy them, delete them. The lock makes the database decide
// between two concurrent requeues of one row: the second finds it gone.
func (d dialect) requeue(ctx context.Context, tx sqlstore.Executor, ids []int64) (int, error) {
	rows, err := tx.Query(ctx, d.lockDead.SQL(), d.lockDead.Args(d.ids(ids))...)
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
	if _, err := tx.Exec(ctx, d.copyDead.SQL(), d.copyDead.Args(d.ids(locked), time.Now().UnixMicro())...); err != nil {
		return 0, err
	}
	if _, err := tx.Exec(ctx, d.deleteDead.SQL(), d.deleteDead.Args(d.ids(locked))...); err != nil {
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
		if err := a.d.validate(topic, m); err != nil {
			return wsql.Query{}, err
		}
		out[i] = Outgoing{Topic: topic, Message: m}
	}
	if len(out) == 0 {
		// InTx's publisher answers a publish without messages itself.
		return wsql.Query{}, errors.New("outbox: no messages to insert")
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

// ids encodes an id list as the argument of the statements taking one.
func (d dialect) ids(ids []int64) any { return d.sql.Outbox.IDs(ids) }

// claimLocks reports whether the claim takes the rows it returns.
func (d dialect) claimLocks() bool { return d.sql.Outbox.ClaimLocks }
