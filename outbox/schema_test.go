package outbox_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// The migration files are what Migrate applies: for the default table
// SchemaDDL is the file itself.
func TestSchemaFilesMatchMigrate(t *testing.T) {
	require.Equal(t, outbox.PostgresSchemaSQL, outbox.SchemaDDL(outbox.PostgreSQL, outbox.DefaultTableName))
	require.Equal(t, outbox.MySQLSchemaSQL, outbox.SchemaDDL(outbox.MySQL, outbox.DefaultTableName))
	require.Equal(t, outbox.SQLiteSchemaSQL, outbox.SchemaDDL(outbox.SQLite, outbox.DefaultTableName))
}

// Another table name renames the table, its dead-letter table, and on
// PostgreSQL the notify function (in the table's schema), its trigger
// and the NOTIFY channel; nothing keeps the default name.
func TestSchemaDDLRendersTableNames(t *testing.T) {
	ddl := outbox.SchemaDDL(outbox.PostgreSQL, "app.orders_outbox")
	for _, want := range []string{
		`CREATE TABLE IF NOT EXISTS "app"."orders_outbox" (`,
		`CREATE TABLE IF NOT EXISTS "app"."orders_outbox_dead_letters" (`,
		`CREATE OR REPLACE FUNCTION "app"."orders_outbox_notify"()`,
		`CREATE OR REPLACE TRIGGER "orders_outbox_notify" AFTER INSERT ON "app"."orders_outbox"`,
		`EXECUTE FUNCTION "app"."orders_outbox_notify"('app.orders_outbox')`,
	} {
		require.Contains(t, ddl, want)
	}
	for _, d := range []outbox.Dialect{outbox.PostgreSQL, outbox.MySQL, outbox.SQLite} {
		ddl := outbox.SchemaDDL(d, "app.orders_outbox")
		require.NotEmpty(t, ddl, d)
		require.False(t, strings.Contains(ddl, outbox.DefaultTableName), "%s: %s", d, ddl)
	}
}
