// Package testenv gives tests their service connections. Addresses come
// from environment variables with localhost defaults. When a service does
// not answer, the test is skipped with a message naming it — except under
// CI=true, where a missing service fails the test.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql" // also registers the "mysql" driver
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib" // also registers the "pgx" driver

	"github.com/idemkit/watermill-idempotent/internal/dsn"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// Environment variables and their defaults.
const (
	PostgresEnv     = "POSTGRES_DSN"
	PostgresDefault = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	MySQLEnv        = "MYSQL_DSN"
	MySQLDefault    = "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC"
)

// MaxConns caps each test pool's connections. Test packages run in
// parallel against one server (PostgreSQL allows 100 clients by default),
// and racing goroutines would otherwise open a connection each. Tests that
// race more goroutines than this still race: the rest wait for the pool.
const MaxConns = 24

// CI reports whether the tests run in CI, where every service must be up.
func CI() bool { return os.Getenv("CI") == "true" }

// Missing skips t because service is unavailable, or fails it under CI.
func Missing(t testing.TB, service string, err error) {
	t.Helper()
	if CI() {
		t.Fatalf("%s is not available (CI=true requires it): %v", service, err)
	}
	t.Skipf("skipping: %s is not available: %v (start it, or set CI=true to make this a failure)", service, err)
}

// MissingAt is Missing for a service found at value, the setting of the
// environment variable env: the message names both, with the value's
// secrets masked (CI logs have many readers).
func MissingAt(t testing.TB, service, env, value string, err error) {
	t.Helper()
	var sc dsn.Scrubber
	sc.Add(value)
	Missing(t, service+" ("+env+"="+dsn.Redact(value)+")", errors.New(sc.Scrub(err.Error())))
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// PostgresDSN returns the PostgreSQL DSN tests use.
func PostgresDSN() string { return getenv(PostgresEnv, PostgresDefault) }

// PgxExecModes are pgx's query exec modes, spelled as the
// default_query_exec_mode connection parameter takes them, pgx's default
// first. In simple_protocol, which PgBouncer's transaction pooling needs,
// pgx quotes the arguments into the statement's text, so the server sees
// (and refuses) some values differently.
var PgxExecModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// PostgresDSNInMode returns PostgresDSN with default_query_exec_mode set
// to mode (one of PgxExecModes), in URL or keyword/value form as the DSN
// is written.
func PostgresDSNInMode(mode string) string {
	dsn := PostgresDSN()
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("default_query_exec_mode", mode)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " default_query_exec_mode=" + mode
}

// PgxPool opens a pgxpool.Pool on the test PostgreSQL database and
// closes it when t ends.
func PgxPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgxPoolOn(t, PostgresDSN())
}

// PgxPoolInMode is PgxPool with every query in the pgx query exec mode
// (one of PgxExecModes) by default.
func PgxPoolInMode(t testing.TB, mode string) *pgxpool.Pool {
	t.Helper()
	return pgxPoolOn(t, PostgresDSNInMode(mode))
}

func pgxPoolOn(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	var pool *pgxpool.Pool
	if err == nil {
		cfg.MaxConns = MaxConns
		pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	}
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = pool.Ping(ctx)
		cancel()
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		MissingAt(t, "PostgreSQL", PostgresEnv, PostgresDSN(), err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PgxSchemaPool creates a schema named prefix + a random suffix, dropped
// with its tables when t ends, and returns a pgxpool.Pool whose
// search_path is that schema, so fixed table names (sqlc's, the default
// ones) are the test's own.
func PgxSchemaPool(t testing.TB, prefix string) *pgxpool.Pool {
	t.Helper()
	schema := postgresSchema(t, prefix)
	cfg, err := pgxpool.ParseConfig(PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = MaxConns
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PostgresSchema creates a schema named prefix + a random suffix, dropped
// with its tables when t ends, and returns it with a database/sql pool
// (pgx stdlib driver) whose search_path is that schema, then the schemas
// in then.
func PostgresSchema(t testing.TB, prefix string, then ...string) (*sql.DB, string) {
	t.Helper()
	schema := postgresSchema(t, prefix)
	cfg, err := pgx.ParseConfig(PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = strings.Join(append([]string{schema}, then...), ", ")
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(MaxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db, schema
}

// Postgres opens the test PostgreSQL database (pgx stdlib driver) and
// closes it when t ends.
func Postgres(t testing.TB) *sql.DB {
	t.Helper()
	return postgresOn(t, PostgresDSN())
}

// PostgresInMode is Postgres with every query in the pgx query exec mode
// (one of PgxExecModes), set as users set it: default_query_exec_mode in
// the DSN.
func PostgresInMode(t testing.TB, mode string) *sql.DB {
	t.Helper()
	return postgresOn(t, PostgresDSNInMode(mode))
}

func postgresOn(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err == nil {
		if err = ping(db); err != nil {
			_ = db.Close() // a skipped test must not leak the pool's goroutine
		}
	}
	if err != nil {
		MissingAt(t, "PostgreSQL", PostgresEnv, PostgresDSN(), err)
	}
	db.SetMaxOpenConns(MaxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// MySQLDSN returns the MySQL/MariaDB DSN (go-sql-driver/mysql format)
// tests use.
func MySQLDSN() string { return getenv(MySQLEnv, MySQLDefault) }

// MySQL opens the test MySQL/MariaDB database (go-sql-driver/mysql) and
// closes it when t ends.
func MySQL(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", MySQLDSN())
	if err == nil {
		if err = ping(db); err != nil {
			_ = db.Close() // a skipped test must not leak the pool's goroutine
		}
	}
	if err != nil {
		MissingAt(t, "MySQL/MariaDB", MySQLEnv, MySQLDSN(), err)
	}
	db.SetMaxOpenConns(MaxConns)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// SQLite opens a fresh SQLite database in t's temporary directory.
func SQLite(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
	if err != nil {
		t.Fatalf("sqlite: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func ping(db *sql.DB) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// PostgresSchemaDSN creates a schema named prefix + a random suffix,
// dropped with its tables when t ends, and returns PostgresDSN (a URL)
// with that schema as its search_path, so that a program's fixed table
// names (the default ones) are the test's own.
func PostgresSchemaDSN(t testing.TB, prefix string) string {
	t.Helper()
	schema := postgresSchema(t, prefix)
	u, err := url.Parse(PostgresDSN())
	if err != nil {
		t.Fatalf("%s must be a URL: %v", PostgresEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// MySQLDatabaseDSN creates a database named prefix + a random suffix,
// dropped with its tables when t ends, and returns MySQLDSN with that
// database, so that a program's fixed table names (the default ones) are
// the test's own.
func MySQLDatabaseDSN(t testing.TB, prefix string) string {
	t.Helper()
	admin := MySQL(t)
	name := prefix + randomHex()
	if _, err := admin.Exec("CREATE DATABASE `" + name + "`"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE `" + name + "`"); err != nil {
			t.Error(err)
		}
	})
	cfg, err := mysql.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("%s: %v", MySQLEnv, err)
	}
	cfg.DBName = name
	return cfg.FormatDSN()
}

// postgresSchema creates a schema named prefix + a random suffix in the
// test PostgreSQL database and drops it with its tables when t ends.
func postgresSchema(t testing.TB, prefix string) string {
	t.Helper()
	db := Postgres(t)
	schema := prefix + randomHex()
	if _, err := db.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`); err != nil {
			t.Error(err)
		}
	})
	return schema
}

// randomHex returns 12 random hex digits, for names no other test uses.
func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}
