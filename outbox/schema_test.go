package outbox_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// The shipped .sql files are what Migrate runs; `make schema` rewrites
// them (internal/cmd/gen-schema).
func TestSchemaFilesMatchMigrate(t *testing.T) {
	require.Equal(t, outbox.SchemaDDL(outbox.PostgreSQL, outbox.DefaultTableName), outbox.PostgresSchemaSQL, "outbox/postgres.sql is stale: run make schema")
	require.Equal(t, outbox.SchemaDDL(outbox.MySQL, outbox.DefaultTableName), outbox.MySQLSchemaSQL, "outbox/mysql.sql is stale: run make schema")
}
