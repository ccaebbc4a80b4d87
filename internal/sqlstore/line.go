package sqlstore

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Line is a migration line: the stores' inbox and versions lines are in
// their dialect's Migrations, the outbox ships its files in its own
// package, so that importing it pulls in no driver. Migrate applies a
// line with the dialect's lock and records it in MigrationsTable under
// the subject "<Name>:<table>".
type Line struct {
	// Dialect supplies the quoting, the placeholders and the lock.
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

// line is the store's migration line name in d.Migrations.
func (d *Dialect) line(name, def string) Line {
	return Line{Dialect: d, FS: d.Migrations, Dir: "migrations/" + name, Name: name, Default: def}
}

func (l Line) migrator(db DB, table string) (migrator, error) {
	if db == nil {
		return migrator{}, fmt.Errorf("%s: db is nil", l.Dialect.Name)
	}
	table = cmp.Or(table, l.Default)
	t, err := l.Dialect.table(table)
	m := migrator{l: l, d: l.Dialect.withDefaults(), db: db, t: t}
	if err == nil && l.Extra != nil {
		m.extra = l.Extra(table)
	}
	return m, err
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
	files, err := l.files()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, f := range files {
		b.WriteString(m.d.render(f.sql, l.Default, m.t, m.extra...))
	}
	return b.String(), nil
}

// nilDB lets DDL build a migrator without a database; it is never used.
type nilDB struct{ DB }

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
