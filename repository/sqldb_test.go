package repository_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
)

// testDB is a database the error-classification tests provoke real
// errors on.
type testDB struct {
	name        string
	open        func(testing.TB) *sql.DB
	placeholder func(int) string
}

var (
	postgresDB = testDB{"postgres", testenv.Postgres, func(n int) string { return fmt.Sprintf("$%d", n) }}
	mysqlDB    = testDB{"mysql", testenv.MySQL, func(int) string { return "?" }}
	sqliteDB   = testDB{"sqlite", testenv.SQLite, func(int) string { return "?" }}
)

// execer opens db and returns a function running a statement written
// with '?' placeholders on it.
func (db testDB) execer(t *testing.T) func(query string, args ...any) error {
	conn := db.open(t)
	return func(query string, args ...any) error {
		for i := range args {
			query = strings.Replace(query, "?", db.placeholder(i+1), 1)
		}
		_, err := conn.ExecContext(context.Background(), query, args...)
		return err
	}
}
