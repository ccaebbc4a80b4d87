package middleware_test

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
)

// dialect is one SQL database for the natural-key and version-guard tests.
type dialect struct {
	name string
	db   *sql.DB
}

// forEachDialect runs fn as a parallel subtest on PostgreSQL, MariaDB and
// SQLite.
func forEachDialect(t *testing.T, fn func(t *testing.T, d dialect)) {
	for _, c := range []struct {
		name string
		open func(testing.TB) *sql.DB
	}{
		{"postgres", testenv.Postgres},
		{"mysql", testenv.MySQL},
		{"sqlite", testenv.SQLite},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fn(t, dialect{name: c.name, db: c.open(t)})
		})
	}
}

// q rewrites "?" placeholders for PostgreSQL.
func (d dialect) q(query string) string {
	if d.name != "postgres" {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// table creates a table with a random name from the column list and drops
// it when t ends.
func (d dialect) table(t *testing.T, prefix, columns string) string {
	t.Helper()
	name := randomName(prefix)
	_, err := d.db.Exec(`CREATE TABLE ` + name + ` (` + columns + `)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := d.db.Exec(`DROP TABLE IF EXISTS ` + name)
		require.NoError(t, err)
	})
	return name
}
