package repository

import "time"

// MigrationsTable records, in the schema of each table a SQL store
// manages, the migrations applied to it, under the subject
// "<line>:<table>" (inbox, versions, partitioned_inbox, outbox).
const MigrationsTable = "watermill_idempotent_migrations"

// Migration is one migration file a SQL store's Migrations applied.
type Migration struct {
	Version  int           // the file's number (0001_… is 1)
	Name     string        // the file name without number and extension
	Duration time.Duration // how long applying it took
}
