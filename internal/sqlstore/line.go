package sqlstore

import (
	"context"
	"io/fs"
	"strconv"
	"strings"
)

// Line is a migration line whose files live outside the dialect's own
// Migrations: the outbox ships its files in its own package, so that
// importing it pulls in no driver. Migrate applies them with the
// dialect's lock and records them in the same MigrationsTable as the
// store's lines, under the subject "<Name>:<table>".
type Line struct {
	// Dialect supplies the quoting, the placeholders and the lock; its
	// Migrations are not read.
	Dialect *Dialect
	// FS holds the files NNNN_name.up.sql in Dir, written for the table
	// name Default.
	FS  fs.FS
	Dir string
	// Name is the subject prefix in MigrationsTable ("outbox").
	Name    string
	Default string
	// Extra returns replacement pairs (old, new, …) for names the files
	// derive from the default table other than "<Default>_suffix" indexes
	// (a second table, a function, a string literal); nil: none.
	Extra func(table string) []string
}

func (l Line) migrator(db DB, table string) (migrator, error) {
	d := *l.Dialect
	d.Migrations = l.FS
	m, err := newMigrator(&d, db, l.Name, l.Default, table)
	if err != nil {
		return m, err
	}
	m.dir = l.Dir
	if l.Extra != nil {
		m.extra = l.Extra(table)
	}
	return m, nil
}

// Migrate applies the line's pending migrations to table; see
// migrator.Migrations for the lock and what is recorded.
func (l Line) Migrate(ctx context.Context, db DB, table string) ([]Migration, error) {
	m, err := l.migrator(db, table)
	if err != nil {
		return nil, err
	}
	return m.Migrations(ctx)
}

// DDL returns every up migration of the line rendered for table, in
// version order, for callers who apply schema with their own tool.
func (l Line) DDL(table string) (string, error) {
	m, err := l.migrator(nilDB{}, table)
	if err != nil {
		return "", err
	}
	files, err := m.files()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, f := range files {
		b.WriteString(m.d.render(f.sql, m.def, m.t, m.extra...))
	}
	return b.String(), nil
}

// The migration locks of the databases. Every migration line of one
// database takes the same one (the stores' inbox and versions lines in
// repository/postgres and repository/mysql, the outbox's line), so no two
// migrations of any kind run at once; SQLite needs none: its write
// transaction is the lock.
const (
	// PostgresMigrateLock is a transaction-level advisory lock:
	// concurrent CREATE … IF NOT EXISTS can still fail on the catalog's
	// unique index.
	PostgresMigrateLock = `SELECT 1 FROM pg_advisory_xact_lock(hashtext('watermill-idempotent-migrate'))`
	// MySQLMigrateLock belongs to a session; if the connection dies, the
	// server drops it. It waits up to a minute. MySQLMigrateUnlock
	// releases it.
	MySQLMigrateLock   = `SELECT GET_LOCK('watermill_idempotent_migrate', 60)`
	MySQLMigrateUnlock = `DO RELEASE_LOCK('watermill_idempotent_migrate')`
)

// nilDB lets DDL build a migrator without a database; it is never used.
type nilDB struct{ DB }

// Stmt is a statement bound for a dialect, for SQL kept outside this
// package (the outbox's).
type Stmt struct{ s stmt }

// Statement binds query, written with {T} for the quoted table and $n for
// the n-th argument, to d's placeholders.
func (d *Dialect) Statement(quotedTable, query string) Stmt {
	return Stmt{d.bind(quotedTable, query)}
}

// SQL is the statement's text.
func (s Stmt) SQL() string { return s.s.text }

// Args returns args in the order the statement's placeholders take them,
// without those it does not use (none when it has no placeholder).
func (s Stmt) Args(args ...any) []any {
	if s.s.max == 0 {
		return nil
	}
	return s.s.values(args)
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
