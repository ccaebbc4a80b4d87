package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore/sqlstoretest"
	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

func TestConformance(t *testing.T)     { sqlstoretest.Run(t, sqlstoretest.Postgres(t)) }
func BenchmarkRepository(b *testing.B) { sqlstoretest.Bench(b, sqlstoretest.Postgres(b)) }

// TestMigrateCreatesIndexesAtEveryTableNameLength migrates an inbox
// table of every length repository.ValidateTableName accepts (1 to 63
// bytes) and checks that each has its expires_at and lease_until indexes. PostgreSQL keeps
// tables and indexes in one namespace and cuts names to 63 bytes, so an
// index named like its table would silently not be created by
// CREATE INDEX IF NOT EXISTS.
func TestMigrateCreatesIndexesAtEveryTableNameLength(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	// A schema of this run's own, so that short names collide with nothing.
	var b [6]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	schema := "idx_" + hex.EncodeToString(b[:])
	_, err = db.ExecContext(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), `DROP SCHEMA `+schema+` CASCADE`)
		require.NoError(t, err)
	})
	for n := 1; n <= 63; n++ {
		table := "t" + strings.Repeat("x", n-1)
		repo, err := postgres.NewRepository(db, postgres.Config{Table: schema + "." + table})
		require.NoError(t, err, "%d bytes", n)
		require.NoError(t, repo.Migrate(ctx), "%d bytes", n)
		require.NoError(t, repo.Migrate(ctx), "%d bytes, again", n)

		rows, err := db.QueryContext(ctx, `SELECT i.indexname, x.indisprimary FROM pg_indexes i
JOIN pg_class c ON c.relname = i.indexname JOIN pg_namespace ns ON ns.oid = c.relnamespace AND ns.nspname = i.schemaname
JOIN pg_index x ON x.indexrelid = c.oid
WHERE i.schemaname = $1 AND i.tablename = $2`, schema, table)
		require.NoError(t, err)
		var primary, secondary []string
		for rows.Next() {
			var name string
			var isPrimary bool
			require.NoError(t, rows.Scan(&name, &isPrimary))
			if isPrimary {
				primary = append(primary, name)
			} else {
				secondary = append(secondary, name)
			}
		}
		require.NoError(t, rows.Err())
		require.Len(t, primary, 1, "%d-byte table %q: primary key index", n, table)
		require.ElementsMatch(t, []string{repository.IndexName(table, "expires_at_idx"), repository.IndexName(table, "lease_until_idx")}, secondary,
			"%d-byte table %q: the janitor's expires_at index", n, table)
	}
}
