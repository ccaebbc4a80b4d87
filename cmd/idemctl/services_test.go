package main

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers the "mysql" driver
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/watermill-idempotent/cmd/idemctl/internal/dsn"
)

// The services the tests use, found as the library's tests find them
// (POSTGRES_DSN, MYSQL_DSN, REDIS_ADDR with localhost defaults). A
// service that does not answer skips the test, or fails it under CI=true.
// idemctl builds from a published library, so its tests do not use the
// library's internal/testenv (TestNoLibraryInternalImports).

const (
	postgresEnv = "POSTGRES_DSN"
	mysqlEnv    = "MYSQL_DSN"
	redisEnv    = "REDIS_ADDR"
)

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// postgresDSN is the test PostgreSQL database, a URL.
func postgresDSN() string {
	return getenv(postgresEnv, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// mysqlDSN is the test MySQL/MariaDB database in go-sql-driver/mysql's
// format.
func mysqlDSN() string {
	return getenv(mysqlEnv, "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC")
}

// redisAddr is the test Redis server's host:port.
func redisAddr() string { return getenv(redisEnv, "127.0.0.1:6379") }

// missing skips t because service, found at value (the setting of env),
// does not answer, or fails it under CI. The message masks the value's
// secrets: CI logs have many readers.
func missing(t testing.TB, service, env, value string, err error) {
	t.Helper()
	var sc dsn.Scrubber
	sc.Add(value)
	msg := service + " (" + env + "=" + dsn.Redact(value) + ") is not available: " + sc.Scrub(err.Error())
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true requires it)", msg)
	}
	t.Skipf("skipping: %s (start it, or set CI=true to make this a failure)", msg)
}

// openTestDB opens and pings the database and closes it when t ends.
func openTestDB(t testing.TB, service, driver, env, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err != nil {
			_ = db.Close() // a skipped test must not leak the pool's goroutine
		}
	}
	if err != nil {
		missing(t, service, env, dsn, err)
	}
	// Test packages run in parallel against one server.
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// testPostgres opens the test PostgreSQL database (pgx's stdlib driver).
func testPostgres(t testing.TB) *sql.DB {
	t.Helper()
	return openTestDB(t, "PostgreSQL", "pgx", postgresEnv, postgresDSN())
}

// testMySQL opens the test MySQL/MariaDB database.
func testMySQL(t testing.TB) *sql.DB {
	t.Helper()
	return openTestDB(t, "MySQL/MariaDB", "mysql", mysqlEnv, mysqlDSN())
}

// testRedis connects to the test Redis server and closes the client when
// t ends. Tests share the server: each takes its own prefix (redisPrefix).
func testRedis(t testing.TB) *goredis.Client {
	t.Helper()
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		missing(t, "Redis", redisEnv, redisAddr(), err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// redisPrefix returns a key prefix no other test uses and deletes the
// keys under it when t ends.
func redisPrefix(t testing.TB, client *goredis.Client) string {
	t.Helper()
	prefix := "watermill-idempotent-test:" + suffix() + ":"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var err error
		for iter.Next(ctx) {
			err = errors.Join(err, client.Del(ctx, iter.Val()).Err())
		}
		if err = errors.Join(err, iter.Err()); err != nil {
			t.Errorf("redis cleanup of %s*: %v", prefix, err)
		}
	})
	return prefix
}
