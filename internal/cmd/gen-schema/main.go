// Command gen-schema writes the outbox's shipped .sql files from the DDL
// its Migrate runs, so they never drift from the code. The inbox and
// version tables need no generation: their migration files
// (repository/<backend>/migrations) are the source of truth.
package main

import (
	"log"
	"os"

	"github.com/idemkit/watermill-idempotent/outbox"
)

func main() {
	for path, ddl := range map[string]string{
		"outbox/postgres.sql": outbox.SchemaDDL(outbox.PostgreSQL, outbox.DefaultTableName),
		"outbox/mysql.sql":    outbox.SchemaDDL(outbox.MySQL, outbox.DefaultTableName),
	} {
		if err := os.WriteFile(path, []byte(ddl), 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
