package repository_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
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

// provoked is an error a statement provoked on a real database, and
// whether the classifier under test must recognise it.
type provoked struct {
	name string
	err  error
	want bool
}

// requireClassified checks that is recognises each case's error exactly
// when the case wants it: as returned, wrapped with %w, and joined with an
// unrelated error.
func requireClassified(t *testing.T, is func(error) bool, cases []provoked) {
	t.Helper()
	for _, c := range cases {
		require.Error(t, c.err, c.name)
		require.Equal(t, c.want, is(c.err), "%s: %v", c.name, c.err)
		require.Equal(t, c.want, is(fmt.Errorf("handler: %w", c.err)), "%s wrapped", c.name)
		require.Equal(t, c.want, is(errors.Join(errors.New("other"), c.err)), "%s joined", c.name)
	}
}
