// Command gen-schema writes each SQL backend's schema.sql from the DDL its
// Migrate runs, so the shipped files never drift from the code.
package main

import (
	"log"
	"os"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

func main() {
	for path, ddl := range map[string]string{
		"repository/mysql/schema.sql":      mysql.SchemaDDL(repository.DefaultTableName),
		"repository/postgres/schema.sql":   postgres.SchemaDDL(repository.DefaultTableName),
		"repository/mysql/versions.sql":    mysql.VersionsSchemaDDL(repository.DefaultVersionsTableName),
		"repository/postgres/versions.sql": postgres.VersionsSchemaDDL(repository.DefaultVersionsTableName),
		"outbox/postgres.sql":              outbox.SchemaDDL(outbox.PostgreSQL, outbox.DefaultTableName),
		"outbox/mysql.sql":                 outbox.SchemaDDL(outbox.MySQL, outbox.DefaultTableName),
	} {
		if err := os.WriteFile(path, []byte(ddl), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
