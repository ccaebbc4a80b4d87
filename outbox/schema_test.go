package outbox_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// The migration files are what Migrate applies: for the default table
// SchemaDDL is the file itself.
func TestSchemaFilesMatchMigrate(t *testing.T) {
	require.Equal(t, outbox.PostgresSchemaSQL, outbox.SchemaDDL(sqldialect.PostgreSQL, outbox.DefaultTableName))
	require.Equal(t, outbox.MySQLSchemaSQL, outbox.SchemaDDL(sqldialect.MySQL, outbox.DefaultTableName))
	require.Equal(t, outbox.SQLiteSchemaSQL, outbox.SchemaDDL(sqldialect.SQLite, outbox.DefaultTableName))
}

// Another table name renames the table, its dead-letter table, and on
// PostgreSQL the notify function (in the table's schema), its trigger
// and the NOTIFY channel; nothing keeps the default name.
func TestSchemaDDLRendersTableNames(t *testing.T) {
	ddl := outbox.SchemaDDL(sqldialect.PostgreSQL, "app.orders_outbox")
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "app"."orders_outbox" (`,
		`CREATE TABLE IF NOT EXISTS "app"."orders_outbox_dead_letters" (`,
		`CREATE OR REPLACE FUNCTION "app"."orders_outbox_notify"()`,
		`CREATE OR REPLACE TRIGGER "orders_outbox_notify" AFTER INSERT ON "app"."orders_outbox"`,
		`EXECUTE FUNCTION "app"."orders_outbox_notify"('app.orders_outbox')`,
	} {
		require.Contains(t, ddl, want)
	}
	for _, d := range []sqldialect.Dialect{sqldialect.PostgreSQL, sqldialect.MySQL, sqldialect.SQLite} {
		ddl := outbox.SchemaDDL(d, "app.orders_outbox")
		require.NotEmpty(t, ddl, d)
		require.False(t, strings.Contains(ddl, outbox.DefaultTableName), "%s: %s", d, ddl)
	}
}

// Migrate records the outbox's migrations in the stores' migrations table
// under "outbox:<table>", applies nothing the second time, and migrates a
// table dropped since afresh.
func TestMigrateIsRecorded(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		versions := func() []int {
			rows, err := b.db.QueryContext(ctx, `SELECT version FROM watermill_idempotent_migrations WHERE subject = `+b.ph(1)+` ORDER BY version`, "outbox:"+b.table)
			require.NoError(t, err)
			defer rows.Close()
			var out []int
			for rows.Next() {
				var v int
				require.NoError(t, rows.Scan(&v))
				out = append(out, v)
			}
			require.NoError(t, rows.Err())
			return out
		}
		want := []int{1}
		if b.dialect == sqldialect.MySQL {
			want = []int{1, 2}
		}
		require.Equal(t, want, versions())
		require.NoError(t, b.outbox.Migrate(ctx, b.db))
		require.Equal(t, want, versions())

		_, err := b.db.ExecContext(ctx, `DROP TABLE `+b.table)
		require.NoError(t, err)
		require.NoError(t, b.outbox.Migrate(ctx, b.db))
		require.Equal(t, want, versions())
		require.Zero(t, b.outboxRows(t))
	})
}
