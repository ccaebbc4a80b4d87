// Package sqlstore is the one SQL implementation of the storage contracts
// (repository.Transactional, TwoPhase, Reader, Cleaner, Operator, Stats
// and VersionGuard) and of versioned migrations. repository/postgres,
// repository/mysql and repository/sqlite each supply a Dialect — SQL text
// and the few differences that are real — and their migration files, and
// expose the store under their own names:
//
//	repo, err := sqlstore.NewInbox(postgresDialect, sqlstore.StdDB(db), config)
//
// Statements are written once, with $1…$n placeholders and {T} for the
// quoted table; Dialect.Bind turns them into the driver's placeholders.
package sqlstore

import (
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Bind is how a driver writes placeholders.
type Bind int

const (
	// Dollar: $1, $2 (PostgreSQL).
	Dollar Bind = iota
	// QuestionNumbered: ?1, ?2 (SQLite).
	QuestionNumbered
	// Question: ?, ? in order, an argument per use (MySQL).
	Question
)

// Dialect is what differs between databases. Statements use {T} for the
// quoted table and $n for the n-th argument.
type Dialect struct {
	// Name prefixes errors ("postgres").
	Name string
	// Quote quotes identifiers (`"` or "`").
	Quote string
	// Bind is the placeholder style.
	Bind Bind
	// Migrations holds migrations/inbox/ and migrations/versions/ of
	// NNNN_name.up.sql and .down.sql files written for the default table
	// names (see render).
	Migrations fs.FS
	// QualifyIndex: an index in another schema is named schema.index and
	// its table unqualified (SQLite), instead of living in the table's.
	QualifyIndex bool
	// MigrateLock, run first, returns one row holding 1 once the migration
	// lock is held; MigrateUnlock, if set, releases a session lock, and the
	// migrations then run outside a transaction (MySQL: DDL commits
	// anyway). Without it they run in one transaction, which holds the
	// lock until it ends. Empty: the transaction itself is the lock.
	MigrateLock, MigrateUnlock string
	// IsApplied recognises the error of a migration statement whose effect
	// is already there (MySQL has no CREATE INDEX IF NOT EXISTS); nil: none.
	IsApplied func(error) bool

	// IgnoreConflict ends an INSERT so that a duplicate primary key inserts
	// nothing; empty when the dialect reports duplicates as errors
	// (IsUniqueViolation) instead.
	IgnoreConflict string
	// LockingRead ends a SELECT that must see the latest committed row
	// inside a transaction whose snapshot may predate it.
	LockingRead string
	// ByteOrder follows a text column in ORDER BY to sort by bytes.
	ByteOrder string
	// Returning: UPDATE … RETURNING exists; otherwise the row is re-read
	// in the same transaction.
	Returning bool
	// ChangedRows: an UPDATE that stores the values already there reports
	// no affected row (MySQL), so 0 needs a second look.
	ChangedRows bool
	// DeleteExpired deletes at most $2 rows expiring before $1, oldest
	// first, skipping locked ones. Empty: PickExpired and DeleteByKeys.
	DeleteExpired string
	// PickExpired locks and returns the primary keys DeleteByKeys(n)
	// deletes, in one READ COMMITTED transaction.
	PickExpired  string
	DeleteByKeys func(n int) string
	// Advance stores version $3 for ($1, $2) if it is newer; the last
	// statement affects one row exactly when it did. Default: one
	// INSERT … ON CONFLICT DO UPDATE … WHERE stored < new.
	Advance []string
	// MaxPayloadHash is the longest payload hash the column holds; 0: any.
	MaxPayloadHash int

	// EncodeTime converts a time into a statement argument; it returns an
	// error for times the column cannot hold.
	EncodeTime func(time.Time) (any, error)
	// DecodeTime converts a scanned non-NULL column value into a time.
	DecodeTime func(any) (time.Time, error)
	// IsUniqueViolation recognises a duplicate-key error by code.
	IsUniqueViolation func(error) bool
	// IsRetryable recognises an error after which a single-statement
	// operation may run again (a deadlock victim); nil: none.
	IsRetryable func(error) bool
}

// Config configures a store: the Config and VersionConfig types of
// repository/postgres, mysql and sqlite are this type.
type Config struct {
	// Table is the store's table, optionally qualified by a schema (or a
	// MySQL database, or an attached SQLite database) as "schema.table".
	// Default: repository.DefaultTableName for the inbox,
	// repository.DefaultVersionsTableName for versions. It is validated
	// with repository.ValidateTableName.
	Table string
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error { return repository.ValidateTableName(c.Table) }

// stmt is a statement bound for the dialect: order maps each placeholder
// to its argument where the dialect cannot reuse arguments, and max is
// the highest $n, so extra arguments are not sent.
type stmt struct {
	text  string
	order []int
	max   int
}

var dollarRe = regexp.MustCompile(`\$(\d+)`)

// bind replaces {T} with the quoted table and $n with the dialect's
// placeholders.
func (d *Dialect) bind(table, query string) stmt {
	var s stmt
	s.text = dollarRe.ReplaceAllStringFunc(strings.ReplaceAll(query, "{T}", table), func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		s.max = max(s.max, n)
		switch d.Bind {
		case QuestionNumbered:
			return "?" + m[1:]
		case Question:
			s.order = append(s.order, n-1)
			return "?"
		}
		return m
	})
	return s
}

// values returns args in the order the statement's placeholders take them.
func (s stmt) values(args []any) []any {
	if s.order == nil {
		if s.max > 0 && s.max < len(args) {
			return args[:s.max]
		}
		return args
	}
	out := make([]any, len(s.order))
	for i, a := range s.order {
		out[i] = args[a]
	}
	return out
}

// tableName is a validated table name in its parts.
type tableName struct {
	schema, name string
	quoted       string // schema-qualified if given
}

func (d *Dialect) table(name string) (tableName, error) {
	q, err := repository.QuoteTableName(name, d.Quote)
	if err != nil {
		return tableName{}, fmt.Errorf("%s: %w", d.Name, err)
	}
	t := tableName{name: name, quoted: q}
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		t.schema, t.name = name[:i], name[i+1:]
	}
	return t, nil
}

// sibling is another table in t's schema.
func (d *Dialect) sibling(t tableName, name string) string {
	if t.schema == "" {
		return d.Quote + name + d.Quote
	}
	return d.Quote + t.schema + d.Quote + "." + d.Quote + name + d.Quote
}

// render turns a migration file written for the default table name def
// into the DDL for t. The files name the table "def" and its indexes
// "def_suffix" (quoted, so nothing else can match); the index names are
// repository.IndexName(t, suffix), the name the default table gets too.
// Pairs in extra come first, so they win over the index names.
func (d *Dialect) render(sql, def string, t tableName, extra ...string) string {
	q := d.Quote
	indexRe := regexp.MustCompile(regexp.QuoteMeta(q+def+"_") + `([a-z0-9_]+)` + regexp.QuoteMeta(q))
	pairs := slices.Clone(extra)
	for _, m := range indexRe.FindAllStringSubmatch(sql, -1) {
		idx := q + repository.IndexName(t.name, m[1]) + q
		if d.QualifyIndex && t.schema != "" {
			idx = q + t.schema + q + "." + idx
		}
		pairs = append(pairs, m[0], idx)
	}
	if d.QualifyIndex {
		pairs = append(pairs, "ON "+q+def+q, "ON "+q+t.name+q)
	}
	pairs = append(pairs, q+def+q, t.quoted)
	return strings.NewReplacer(pairs...).Replace(sql)
}
