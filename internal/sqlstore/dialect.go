// Package sqlstore is the one SQL implementation of the storage contracts
// (repository.Transactional, TwoPhase, Reader, Cleaner, Operator, Stats,
// VersionGuard) and of versioned migrations. repository/postgres, mysql
// and sqlite each supply a Dialect and their migration files:
//
//	repo, err := sqlstore.NewInbox(postgresDialect, sqlstore.StdDB(db), config)
//
// Statements are written once, with {T} for the quoted table and $n for
// the n-th argument; the dialect's Bind rewrites the placeholders.
package sqlstore

import (
	"context"
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
	Dollar           Bind = iota // $1, $2 (PostgreSQL)
	QuestionNumbered             // ?1, ?2 (SQLite)
	Question                     // ?, ? in order, an argument per use (MySQL)
)

// Dialect holds the differences between databases that are real.
type Dialect struct {
	Name  string // prefixes errors ("postgres")
	Quote string // quotes identifiers (`"` or "`")
	Bind  Bind
	// Migrations holds migrations/{inbox,versions}/NNNN_name.up.sql.
	Migrations fs.FS
	// QualifyIndex: an index in another schema is named schema.index, its
	// table unqualified (SQLite).
	QualifyIndex bool
	// MigrateLock returns one row holding 1 once the lock is held. With
	// MigrateUnlock (a session lock, MySQL, whose DDL commits anyway) the
	// migrations run outside a transaction; without it in one transaction
	// that holds the lock. Empty: the transaction is the lock (SQLite).
	MigrateLock, MigrateUnlock string
	// IsApplied recognises a migration statement whose effect is already
	// there (MySQL has no CREATE INDEX IF NOT EXISTS).
	IsApplied func(error) bool

	// IgnoreConflict ends an INSERT so that a duplicate key inserts
	// nothing; empty: duplicates fail with IsUniqueViolation (MySQL).
	IgnoreConflict string
	LockingRead    string // ends a SELECT that must see the latest committed row
	ByteOrder      string // follows a text column in ORDER BY to sort by bytes
	Returning      bool   // UPDATE … RETURNING exists; else re-read in the transaction
	// ChangedRows: an UPDATE storing the values already there reports no
	// affected row (MySQL), so 0 needs a second look.
	ChangedRows bool
	// DeleteExpired deletes at most $2 rows expiring before $1, oldest
	// first, skipping locked ones. Empty: PickExpired locks and returns
	// primary keys that DeleteByKeys(n) deletes, in one READ COMMITTED
	// transaction.
	DeleteExpired string
	PickExpired   string
	DeleteByKeys  func(n int) string
	// Advance stores version $3 for ($1, $2) if newer; the last statement
	// affects one row exactly when it did. Default: one INSERT … ON
	// CONFLICT DO UPDATE … WHERE stored < new.
	Advance        []string
	MaxPayloadHash int // the longest payload hash the column holds; 0: any

	// EncodeTime converts a time into an argument, failing for times the
	// column cannot hold; DecodeTime converts a scanned non-NULL value.
	// Both nil: the driver's own time.Time, sent in UTC (PostgreSQL).
	EncodeTime func(time.Time) (any, error)
	DecodeTime func(any) (time.Time, error)
	// IsUniqueViolation (default repository.IsUniqueViolation) and
	// IsRetryable (a deadlock victim; nil: none) recognise errors by code.
	IsUniqueViolation, IsRetryable func(error) bool
}

// withDefaults returns a copy of d with its empty fields set.
func (d Dialect) withDefaults() *Dialect {
	if d.Advance == nil {
		d.Advance = []string{`INSERT INTO {T} AS v (consumer, entity, version) VALUES ($1, $2, $3)
ON CONFLICT (consumer, entity) DO UPDATE SET version = excluded.version WHERE v.version < excluded.version`}
	}
	if d.EncodeTime == nil {
		d.EncodeTime = func(t time.Time) (any, error) { return t.UTC(), nil }
	}
	if d.IsUniqueViolation == nil {
		d.IsUniqueViolation = repository.IsUniqueViolation
	}
	return &d
}

// Config configures a store (it is the backends' Config).
type Config struct {
	// Table is the store's table, optionally "schema.table", validated by
	// repository.ValidateTableName. Default: repository.DefaultTableName
	// (inbox), repository.DefaultVersionsTableName (versions).
	Table string
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error { return repository.ValidateTableName(c.Table) }

// Stmt is a statement bound for a dialect's placeholders: order maps each
// placeholder to its argument (Question), max is the highest $n, so extra
// arguments are not sent.
type Stmt struct {
	text  string
	order []int
	max   int
	// inline: send the values written into the text (see send).
	inline bool
}

var dollarRe = regexp.MustCompile(`\$(\d+)`)

// Statement binds query, written with {T} for the quoted table and $n for
// the n-th argument, to d's placeholders.
func (d *Dialect) Statement(quotedTable, query string) Stmt {
	var s Stmt
	s.text = dollarRe.ReplaceAllStringFunc(strings.ReplaceAll(query, "{T}", quotedTable), func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		s.max = max(s.max, n)
		if d.Bind == Question {
			s.order = append(s.order, n-1)
		}
		return d.Placeholder(n)
	})
	return s
}

// Placeholder is the n-th (1-based) placeholder of d, for statements
// built argument by argument in order.
func (d *Dialect) Placeholder(n int) string {
	switch d.Bind {
	case QuestionNumbered:
		return "?" + strconv.Itoa(n)
	case Question:
		return "?"
	}
	return "$" + strconv.Itoa(n)
}

// SQL is the statement's text.
func (s Stmt) SQL() string { return s.text }

// Args returns args in the order the statement's placeholders take them,
// without those it does not use.
func (s Stmt) Args(args ...any) []any {
	if s.order == nil {
		return args[:min(len(args), s.max)]
	}
	out := make([]any, len(s.order))
	for i, a := range s.order {
		out[i] = args[a]
	}
	return out
}

func (s Stmt) exec(ctx context.Context, ex Executor, args ...any) (int64, error) {
	text, vals := s.send(args)
	return ex.Exec(ctx, text, vals...)
}

func (s Stmt) row(ctx context.Context, ex Executor, args ...any) Row {
	text, vals := s.send(args)
	return ex.QueryRow(ctx, text, vals...)
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
// into the DDL for t: the quoted "def" becomes t and the quoted
// "def_suffix" indexes repository.IndexName(t, suffix). Pairs in extra
// come first, so they win.
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
