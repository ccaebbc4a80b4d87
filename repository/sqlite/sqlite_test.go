package sqlite_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore/sqlstoretest"
	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

func TestConformance(t *testing.T)     { sqlstoretest.Run(t, sqlstoretest.SQLite(t)) }
func BenchmarkRepository(b *testing.B) { sqlstoretest.Bench(b, sqlstoretest.SQLite(b)) }

// TestMigrateCreatesIndexesAtEveryTableNameLength migrates an inbox
// table of every length repository.ValidateTableName accepts and checks
// that each has its expires_at index. SQLite keeps tables and indexes in
// one namespace: an index named like its table could not be created.
func TestMigrateCreatesIndexesAtEveryTableNameLength(t *testing.T) {
	db := testenv.SQLite(t)
	ctx := t.Context()
	for n := 1; n <= 63; n++ {
		table := "t" + strings.Repeat("x", n-1)
		repo, err := sqlite.NewRepository(db, sqlite.Config{Table: table})
		require.NoError(t, err, "%d bytes", n)
		require.NoError(t, repo.Migrate(ctx), "%d bytes", n)
		require.NoError(t, repo.Migrate(ctx), "%d bytes, again", n)

		var names []string
		rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL`, table)
		require.NoError(t, err)
		for rows.Next() {
			var name string
			require.NoError(t, rows.Scan(&name))
			names = append(names, name)
		}
		require.NoError(t, rows.Err())
		require.ElementsMatch(t, []string{repository.IndexName(table, "expires_at_idx"), repository.IndexName(table, "lease_until_idx")}, names, "%d-byte table %q", n, table)
	}
}
