package outbox

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// The migration files are what Migrate applies: for the default table
// the DDL is the up files, in order, as shipped.
func TestSchemaFilesMatchMigrate(t *testing.T) {
	for _, d := range []sqldialect.Dialect{sqldialect.PostgreSQL, sqldialect.MySQL, sqldialect.SQLite} {
		files, err := fs.Glob(Migrations, "migrations/"+string(d)+"/*.up.sql")
		require.NoError(t, err)
		require.NotEmpty(t, files, d)
		ddl := schemaDDL(d, DefaultTableName)
		for _, f := range files {
			b, err := fs.ReadFile(Migrations, f)
			require.NoError(t, err)
			require.Contains(t, ddl, strings.TrimSpace(string(b)), "%s: %s", d, f)
		}
	}
	require.Empty(t, schemaDDL(sqldialect.PostgreSQL, "bad name"))
	require.Empty(t, schemaDDL("oracle", DefaultTableName))
}

// Another table name renames the table, its dead-letter table, and on
// PostgreSQL the notify function (in the table's schema), its trigger
// and the NOTIFY channel; nothing keeps the default name.
func TestSchemaDDLRendersTableNames(t *testing.T) {
	ddl := schemaDDL(sqldialect.PostgreSQL, "app.orders_outbox")
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
		ddl := schemaDDL(d, "app.orders_outbox")
		require.NotEmpty(t, ddl, d)
		require.False(t, strings.Contains(ddl, DefaultTableName), "%s: %s", d, ddl)
	}
}
