package migration_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	gmmysql "github.com/golang-migrate/migrate/v4/database/mysql"
	gmpgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	gmsqlite "github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/sqlstoretest"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/tests/migration"
)

// backend is one SQL backend under test.
type backend struct {
	name       string
	open       func(testing.TB) *sql.DB
	quote      string
	migrations fs.FS
	inbox      func(*sql.DB, string) (sqlstoretest.Inbox, error)
	versions   func(*sql.DB, string) (sqlstoretest.Versions, error)
	// oldDDL is the DDL Migrate ran before migrations were versioned.
	oldDDL string
	// schema creates and drops a schema (%s) of a test's own; indexes
	// lists the secondary indexes of table $2 in schema $1.
	createSchema, dropSchema, indexes string
}

var backends = []backend{
	{
		name: "sqlite", open: testenv.SQLite, quote: `"`, migrations: sqlite.Migrations,
		inbox: func(db *sql.DB, t string) (sqlstoretest.Inbox, error) {
			return sqlite.NewRepository(db, sqlite.Config{Table: t})
		},
		versions: func(db *sql.DB, t string) (sqlstoretest.Versions, error) {
			return sqlite.NewVersionStore(db, sqlite.VersionConfig{Table: t})
		},
		oldDDL: `CREATE TABLE IF NOT EXISTS "%[1]s" (
    consumer     TEXT    NOT NULL, dedup_key    TEXT    NOT NULL, state        TEXT    NOT NULL,
    payload_hash BLOB, result       BLOB, attempts     INTEGER NOT NULL DEFAULT 1,
    lease_owner  TEXT, lease_until  INTEGER, created_at   INTEGER NOT NULL, completed_at INTEGER,
    expires_at   INTEGER NOT NULL, PRIMARY KEY (consumer, dedup_key));
CREATE INDEX IF NOT EXISTS "%[1]s_expires_at_idx" ON "%[1]s" (expires_at);`,
		indexes: `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?2 AND sql IS NOT NULL AND ?1 = ''`,
	},
	{
		name: "postgres", open: testenv.Postgres, quote: `"`, migrations: postgres.Migrations,
		inbox: func(db *sql.DB, t string) (sqlstoretest.Inbox, error) {
			return postgres.NewRepository(db, postgres.Config{Table: t})
		},
		versions: func(db *sql.DB, t string) (sqlstoretest.Versions, error) {
			return postgres.NewVersionStore(db, postgres.VersionConfig{Table: t})
		},
		oldDDL: `CREATE TABLE IF NOT EXISTS "%[1]s" (
    consumer VARCHAR(255) NOT NULL, dedup_key VARCHAR(255) NOT NULL, state VARCHAR(16) NOT NULL,
    payload_hash BYTEA, result BYTEA, attempts INTEGER NOT NULL DEFAULT 1,
    lease_owner VARCHAR(255), lease_until TIMESTAMPTZ, created_at TIMESTAMPTZ NOT NULL, completed_at TIMESTAMPTZ,
    expires_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (consumer, dedup_key));
CREATE INDEX IF NOT EXISTS "%[1]s_expires_at_idx" ON "%[1]s" (expires_at);`,
		createSchema: `CREATE SCHEMA %s`, dropSchema: `DROP SCHEMA %s CASCADE`,
		indexes: `SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace ns ON ns.oid = t.relnamespace WHERE ns.nspname = $1 AND t.relname = $2 AND NOT x.indisprimary`,
	},
	{
		name: "mysql", open: testenv.MySQL, quote: "`", migrations: mysql.Migrations,
		inbox: func(db *sql.DB, t string) (sqlstoretest.Inbox, error) {
			return mysql.NewRepository(db, mysql.Config{Table: t})
		},
		versions: func(db *sql.DB, t string) (sqlstoretest.Versions, error) {
			return mysql.NewVersionStore(db, mysql.VersionConfig{Table: t})
		},
		oldDDL: "CREATE TABLE IF NOT EXISTS `%[1]s` (" + `
    consumer VARBINARY(255) NOT NULL, dedup_key VARBINARY(255) NOT NULL, state VARCHAR(16) NOT NULL,
    payload_hash VARBINARY(255), result LONGBLOB, attempts INT NOT NULL DEFAULT 1,
    lease_owner VARBINARY(255), lease_until DATETIME(6), created_at DATETIME(6) NOT NULL, completed_at DATETIME(6),
    expires_at DATETIME(6) NOT NULL, PRIMARY KEY (consumer, dedup_key),
    KEY ` + "`%[1]s_expires_at_idx`" + ` (expires_at)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		createSchema: "CREATE DATABASE %s", dropSchema: "DROP DATABASE %s",
		indexes: `SELECT DISTINCT index_name FROM information_schema.statistics WHERE table_schema = ? AND table_name = ? AND index_name <> 'PRIMARY'`,
	},
}

func versionsOf(ms []sqlstore.Migration) []int {
	out := []int{}
	for _, m := range ms {
		out = append(out, m.Version)
	}
	return out
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

func drop(t testing.TB, db *sql.DB, b backend, table string) {
	_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+b.quote+table+b.quote)
	require.NoError(t, err)
}

// TestMigrationsAreVersionedAndReported: Migrate applies every migration
// once, says which, does nothing the second time, and migrates a table
// that was dropped since afresh.
func TestMigrationsAreVersionedAndReported(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			inbox, versions := randomName("mig"), randomName("migv")
			t.Cleanup(func() { drop(t, db, b, inbox); drop(t, db, b, versions) })
			repo, err := b.inbox(db, inbox)
			require.NoError(t, err)
			applied, err := repo.Migrations(t.Context())
			require.NoError(t, err)
			require.Equal(t, []int{1, 2}, versionsOf(applied))
			require.Equal(t, "create_inbox", applied[0].Name)
			applied, err = repo.Migrations(t.Context())
			require.NoError(t, err)
			require.Empty(t, applied, "nothing is pending")

			vs, err := b.versions(db, versions)
			require.NoError(t, err)
			applied, err = vs.Migrations(t.Context())
			require.NoError(t, err)
			require.Equal(t, []int{1}, versionsOf(applied))

			drop(t, db, b, inbox)
			applied, err = repo.Migrations(t.Context())
			require.NoError(t, err)
			require.Equal(t, []int{1, 2}, versionsOf(applied), "a dropped table is migrated again")
			_, err = repo.Get(t.Context(), "c", "k")
			require.ErrorIs(t, err, repository.ErrNotFound)
		})
	}
}

// TestMigrateAdoptsTableFromBeforeVersions: a table created by the
// unversioned Migrate of earlier releases upgrades cleanly, records kept.
func TestMigrateAdoptsTableFromBeforeVersions(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db := b.open(t)
			table := randomName("old")
			t.Cleanup(func() { drop(t, db, b, table) })
			for _, st := range strings.Split(fmt.Sprintf(b.oldDDL, table), ";\n") {
				_, err := db.ExecContext(t.Context(), st)
				require.NoError(t, err)
			}
			repo, err := b.inbox(db, table)
			require.NoError(t, err)
			now := time.Now().UTC().Truncate(time.Microsecond)
			acq, err := repo.Acquire(t.Context(), repository.AcquireParams{Consumer: "c", Key: "k", Owner: "o",
				Now: now.Add(-time.Hour), LeaseUntil: now.Add(-time.Minute), ExpiresAt: now.Add(time.Hour)})
			require.NoError(t, err)
			require.True(t, acq.Acquired)

			applied, err := repo.Migrations(t.Context())
			require.NoError(t, err)
			require.Equal(t, []int{1, 2}, versionsOf(applied))
			stuck, err := repo.ListStuck(t.Context(), repository.ListStuckParams{Now: now})
			require.NoError(t, err)
			require.Len(t, stuck, 1, "the record written before the upgrade is still there")
			require.Equal(t, "o", stuck[0].LeaseOwner)
		})
	}
}

// TestMigrateCreatesIndexesAtEveryTableNameLength migrates an inbox table
// of every length repository.ValidateTableName accepts (1 to 63 bytes)
// and finds each of its indexes under the name repository.IndexName
// gives. PostgreSQL and SQLite keep tables and indexes in one namespace
// (and PostgreSQL cuts names to 63 bytes), so an index named like its
// table would not be created by CREATE INDEX IF NOT EXISTS.
func TestMigrateCreatesIndexesAtEveryTableNameLength(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			db, ctx, schema, prefix := b.open(t), t.Context(), "", ""
			if b.createSchema != "" { // a schema of its own: short names collide with nothing
				schema = randomName("idx")
				prefix = schema + "."
				_, err := db.ExecContext(ctx, fmt.Sprintf(b.createSchema, schema))
				require.NoError(t, err)
				t.Cleanup(func() {
					_, err := db.ExecContext(context.Background(), fmt.Sprintf(b.dropSchema, schema))
					require.NoError(t, err)
				})
			}
			for n := 1; n <= 63; n++ {
				table := "t" + strings.Repeat("x", n-1)
				repo, err := b.inbox(db, prefix+table)
				require.NoError(t, err, "%d bytes", n)
				require.NoError(t, repo.Migrate(ctx), "%d bytes", n)
				require.NoError(t, repo.Migrate(ctx), "%d bytes, again", n)
				names, err := collectNames(ctx, db, b.indexes, schema, table)
				require.NoError(t, err)
				require.ElementsMatch(t, []string{repository.IndexName(table, "expires_at_idx"), repository.IndexName(table, "lease_until_idx")},
					names, "%d-byte table %q", n, table)
			}
		})
	}
}

func collectNames(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, rows.Err()
}

// golangMigrate applies a backend's shipped files for line (inbox,
// versions) with golang-migrate, each line with its own migrations table.
// inst opens a pool of its own: closing the migration closes it.
func golangMigrate(t testing.TB, b backend, inst func(table string) (database.Driver, error), line string) {
	t.Helper()
	drv, err := inst("schema_migrations_" + line)
	require.NoError(t, err)
	migration.GolangMigrate(t, b.migrations, "migrations/"+line, b.name, drv)
}

// TestGolangMigratePostgres: the shipped PostgreSQL files applied by
// golang-migrate (in a schema of their own, default table names) pass
// the conformance suite, and migrate down and up again.
func TestGolangMigratePostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the whole conformance suite on the migrated schema")
	}
	db := testenv.Postgres(t)
	b := backends[1]
	dsn := testenv.PostgresDSN()
	sep := map[bool]string{true: "&", false: "?"}[strings.Contains(dsn, "?")]
	// apply runs golang-migrate in schema, created if needed, and returns
	// the pool it used (search_path=schema).
	apply := func(t *testing.T, schema string, down bool) {
		_, err := db.ExecContext(t.Context(), `CREATE SCHEMA IF NOT EXISTS "`+schema+`"`)
		require.NoError(t, err)
		inst := func(table string) (database.Driver, error) {
			sdb, err := sql.Open("pgx", dsn+sep+"search_path="+schema)
			require.NoError(t, err)
			return gmpgx.WithInstance(sdb, &gmpgx.Config{MigrationsTable: table, SchemaName: schema})
		}
		golangMigrate(t, b, inst, "inbox")
		golangMigrate(t, b, inst, "versions")
		if down {
			src, err := iofs.New(b.migrations, "migrations/inbox")
			require.NoError(t, err)
			drv, err := inst("schema_migrations_inbox")
			require.NoError(t, err)
			m, err := migrate.NewWithInstance("iofs", src, b.name, drv)
			require.NoError(t, err)
			require.NoError(t, m.Down())
			_, _ = m.Close()
		}
	}
	repotest.Run(t, repotest.Backend{
		Name:     "postgres (golang-migrate)",
		DB:       db,
		Features: repotest.Features{Transactional: true, TwoPhase: true, Operator: true, Stats: true},
		New: func(t *testing.T, schema string) (repotest.Repository, error) {
			if err := repository.ValidateTableName(schema); err != nil || strings.Contains(schema, ".") {
				return nil, fmt.Errorf("%w: %q", repository.ErrInvalidTableName, schema)
			}
			t.Cleanup(func() {
				_, err := db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
				require.NoError(t, err)
			})
			apply(t, schema, false)
			return postgres.NewRepository(db, postgres.Config{Table: schema + "." + repository.DefaultTableName})
		},
	})
	t.Run("DownAndUpAgain", func(t *testing.T) {
		schema := randomName("gm")
		t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`) })
		apply(t, schema, true)
		var n int
		require.NoError(t, db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM pg_tables WHERE schemaname = $1 AND tablename = $2`,
			schema, repository.DefaultTableName).Scan(&n))
		require.Zero(t, n, "down removed the inbox table")
		apply(t, schema, false)
		repo, err := postgres.NewRepository(db, postgres.Config{Table: schema + "." + repository.DefaultTableName})
		require.NoError(t, err)
		applied, err := repo.Migrations(t.Context())
		require.NoError(t, err)
		require.Equal(t, []int{1, 2}, versionsOf(applied), "Migrate adopts what golang-migrate created (every file runs twice safely)")
	})
}

// TestGolangMigrateMySQLAndSQLite: the shipped MySQL and SQLite files
// apply with golang-migrate for the default names, and Migrate then
// adopts the result and the store works on it.
func TestGolangMigrateMySQLAndSQLite(t *testing.T) {
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		cfg, err := driver.ParseDSN(testenv.MySQLDatabaseDSN(t, "gm_"))
		require.NoError(t, err)
		cfg.MultiStatements = true
		inst := func(table string) (database.Driver, error) {
			db, err := sql.Open("mysql", cfg.FormatDSN())
			require.NoError(t, err)
			return gmmysql.WithInstance(db, &gmmysql.Config{MigrationsTable: table})
		}
		db, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		checkAdopted(t, backends[2], db, inst)
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "gm.db")
		inst := func(table string) (database.Driver, error) {
			db, err := sqlite.Open(path)
			require.NoError(t, err)
			return gmsqlite.WithInstance(db, &gmsqlite.Config{MigrationsTable: table})
		}
		db, err := sqlite.Open(path)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		checkAdopted(t, backends[0], db, inst)
	})
}

func checkAdopted(t *testing.T, b backend, db *sql.DB, inst func(string) (database.Driver, error)) {
	golangMigrate(t, b, inst, "inbox")
	golangMigrate(t, b, inst, "versions")
	repo, err := b.inbox(db, "")
	require.NoError(t, err)
	applied, err := repo.Migrations(t.Context())
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, versionsOf(applied))
	vs, err := b.versions(db, "")
	require.NoError(t, err)
	applied, err = vs.Migrations(t.Context())
	require.NoError(t, err)
	require.Equal(t, []int{1}, versionsOf(applied))
	tx, err := db.BeginTx(t.Context(), nil) // SQLite: the pool's one connection
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	now := time.Now()
	d, ok := repo.(repository.Driver[*sql.Tx])
	require.True(t, ok, "%s's repository is a repository.Driver[*sql.Tx]", b.name)
	c, err := d.Claim(t.Context(), tx, []repository.ClaimParams{{Consumer: "c", Key: "k", Now: now, ExpiresAt: now.Add(time.Hour)}})
	require.NoError(t, err)
	require.True(t, c[0].Claimed)
	g, ok := vs.(repository.VersionGuard[*sql.Tx])
	require.True(t, ok, "%s's version store is a repository.VersionGuard[*sql.Tx]", b.name)
	ok, err = g.Advance(t.Context(), tx, repository.AdvanceParams{Consumer: "c", Entity: "e", Version: 1})
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tx.Commit())
}
