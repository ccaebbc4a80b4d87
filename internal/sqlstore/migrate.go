package sqlstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// MigrationsTable records the applied migrations of every table the store
// manages, in the schema of that table.
const MigrationsTable = repository.MigrationsTable

// migrationsDDL is portable: every dialect accepts it as written.
const migrationsDDL = `CREATE TABLE IF NOT EXISTS {T} (
    subject    VARCHAR(255) NOT NULL,
    version    INTEGER      NOT NULL,
    name       VARCHAR(255) NOT NULL,
    applied_at TIMESTAMP    NOT NULL DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (subject, version)
)`

// Migration is one migration file set; Migrations returns those it applied.
type Migration = repository.Migration

// migrator applies a migration line to one table.
type migrator struct {
	l     Line
	d     *Dialect // l.Dialect with its defaults
	db    DB
	t     tableName
	extra []string // l.Extra(table)
}

// wrap prefixes err with the dialect and operation, and tells a deadlock
// victim's caller what to do; nil stays nil.
func (m *migrator) wrap(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case m.d.isRetryable(err):
		return fmt.Errorf("%s: %s: deadlock: the database rolled the whole transaction back; roll back and retry: %w", m.d.Name, op, err)
	}
	return fmt.Errorf("%s: %s: %w", m.d.Name, op, err)
}

// Migrate applies the table's pending migrations; see Migrations.
func (m *migrator) Migrate(ctx context.Context) error {
	_, err := m.Migrations(ctx)
	return err
}

// Migrations applies, in version order and under the dialect's migration
// lock (PostgreSQL: an advisory lock; MySQL: GET_LOCK; SQLite: its write
// transaction), the table's migrations not yet recorded in
// MigrationsTable (in the table's schema), records each, and returns those
// it applied: none when the schema is up to date.
//
// On PostgreSQL and SQLite all of it commits in one transaction or none
// does, and every file can run twice (IF NOT EXISTS). MySQL commits DDL
// statement by statement; a statement whose effect is already there (an
// index created before a crash) counts as applied. Migration 1 creates
// the table IF NOT EXISTS, so a table made by an earlier version of this
// package is adopted; a table dropped after it was migrated is migrated
// again.
func (m *migrator) Migrations(ctx context.Context) ([]Migration, error) {
	files, err := m.l.files()
	if err != nil {
		return nil, m.wrap("migrate", err)
	}
	probe := m.d.Bound(m.t.quoted, m.d.Migrate.Probe).text
	missing := m.db.QueryRow(ctx, probe).Scan(new(int)) != nil
	table, subject := m.d.sibling(m.t, MigrationsTable), m.l.Name+":"+m.t.name
	exec := func(ex Executor, q SQL, args ...any) error {
		_, err := m.d.Bound(table, q).exec(ctx, ex, args...)
		return err
	}
	var applied []Migration
	run := func(ex Executor) error {
		applied = nil
		if m.d.MigrateLock != "" {
			var got int
			if err := ex.QueryRow(ctx, m.d.MigrateLock).Scan(&got); err != nil || got != 1 {
				return fmt.Errorf("lock (got %d): %w", got, err)
			}
		}
		if m.d.MigrateUnlock != "" {
			defer func() { _, _ = ex.Exec(context.WithoutCancel(ctx), m.d.MigrateUnlock) }()
		}
		if missing {
			// Look again under the lock: another runner may have migrated
			// meanwhile, and its records are not void (MySQL's files
			// cannot even run twice).
			if missing, err = m.absent(ctx, ex, probe); err != nil {
				return err
			}
		}
		if _, err := ex.Exec(ctx, strings.ReplaceAll(migrationsDDL, "{T}", table)); err != nil {
			return err
		}
		if missing { // records of a dropped table are void
			if err := exec(ex, m.d.Migrate.Forget, subject); err != nil {
				return err
			}
		}
		done, err := collect(ctx, ex, m.d.Bound(table, m.d.Migrate.Applied), func(r Row) (v int, err error) {
			err = r.Scan(&v)
			return
		}, subject)
		if err != nil {
			return err
		}
		for _, f := range files {
			if slices.Contains(done, f.Version) {
				continue
			}
			start := time.Now()
			for _, st := range statements(m.d.render(f.sql, m.l.Default, m.t, m.extra...)) {
				if _, err := ex.Exec(ctx, st); err != nil && !m.d.isAlreadyDone(err) {
					return fmt.Errorf("%04d_%s: %w", f.Version, f.Name, err)
				}
			}
			if err := exec(ex, m.d.Migrate.Record, subject, f.Version, f.Name); err != nil {
				return err
			}
			f.Duration = time.Since(start)
			applied = append(applied, f.Migration)
		}
		return nil
	}
	if m.d.MigrateUnlock != "" {
		err = m.db.OnSession(ctx, run)
	} else {
		err = m.db.InTx(ctx, false, run)
	}
	if err != nil {
		return nil, m.wrap("migrate "+m.t.name, err)
	}
	return applied, nil
}

// absent reports whether probe, a query of the table, fails. In the
// migration's transaction (no MigrateUnlock) it runs in a savepoint, as a
// failed statement aborts a PostgreSQL transaction.
func (m *migrator) absent(ctx context.Context, ex Executor, probe string) (bool, error) {
	if m.d.MigrateUnlock != "" {
		return ex.QueryRow(ctx, probe).Scan(new(int)) != nil, nil
	}
	if _, err := ex.Exec(ctx, `SAVEPOINT probe`); err != nil {
		return false, err
	}
	if ex.QueryRow(ctx, probe).Scan(new(int)) == nil {
		_, err := ex.Exec(ctx, `RELEASE SAVEPOINT probe`)
		return false, err
	}
	_, err := ex.Exec(ctx, `ROLLBACK TO SAVEPOINT probe`)
	return true, err
}

type migrationFile struct {
	Migration
	sql string
}

var fileRe = regexp.MustCompile(`(\d+)_(\w+)\.up\.sql$`)

// files reads the line's up migrations in version order.
func (l Line) files() ([]migrationFile, error) {
	names, err := fs.Glob(l.FS, path.Join(l.Dir, "*.up.sql"))
	if err == nil && len(names) == 0 {
		err = errors.New("no migrations in " + l.Dir)
	}
	var out []migrationFile
	for _, name := range names {
		b, rerr := fs.ReadFile(l.FS, name)
		match := fileRe.FindStringSubmatch(name)
		v, _ := strconv.Atoi(match[1])
		out, err = append(out, migrationFile{Migration{Version: v, Name: match[2]}, string(b)}), cmp.Or(err, rerr)
	}
	slices.SortFunc(out, func(a, b migrationFile) int { return a.Version - b.Version })
	return out, err
}

var (
	statementEnd = regexp.MustCompile(`;\s*(\n|$)`)
	commentLine  = regexp.MustCompile(`(?m)^\s*--.*$`)
)

// statements splits a migration file into its statements, each ending
// with ';' at the end of a line: MySQL runs one statement per call.
func statements(sql string) []string {
	var out []string
	for _, part := range statementEnd.Split(commentLine.ReplaceAllString(sql, ""), -1) {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
