package postgres

import (
	"database/sql"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
)

// PartitionedConfig configures a PartitionedRepository: Table (default
// repository.DefaultTableName), Interval (the span of expires_at per
// partition, default 24h) and Ahead (how far ahead partitions are
// created, default 8 days; make it exceed the inbox retention).
type PartitionedConfig = sqlstore.PartitionConfig

// PartitionedRepository is the opt-in inbox for big tables: the table is
// range-partitioned by expires_at, and cleanup (DeleteExpired, so the
// janitor) detaches and drops whole expired partitions instead of
// deleting rows — no dead tuples, no VACUUM debt, the disk returned at
// once. Records outlive their ExpiresAt by up to one Interval.
//
// PostgreSQL has no unique index across partitions, so the race between
// two claims of one key is decided by a transaction-scoped advisory lock
// per (table, consumer, key) that every claim takes before it looks the
// key up in all partitions and inserts it only if absent: a second claim
// waits until the first transaction ends, then sees its row. The table
// part is the table's OID as the database resolves the configured name,
// so repositories configured "t", "public.t" or "t" under another
// search_path share the lock as they share the table. Claims must
// therefore run under READ COMMITTED (PostgreSQL's default); other levels
// are refused with repository.ErrInvalidParams. Only claims made through
// this type take the lock: never write the table by other means.
//
// It implements repository.Transactional, BatchTransactional, TwoPhase,
// Reader, Cleaner, Operator and Stats and is safe for concurrent use. See
// docs/partitioning.md for the measurements and for pg_partman.
type PartitionedRepository = sqlstore.PartitionedInbox

// NewPartitionedRepository returns a PartitionedRepository over db. Call
// Migrate to create the partitioned table (migration line
// migrations/partitioned_inbox) and its first partitions; the table must
// not be one NewRepository created.
func NewPartitionedRepository(db *sql.DB, config PartitionedConfig) (*PartitionedRepository, error) {
	return sqlstore.NewPartitionedInbox(dialect, sqlstore.StdDB(db), config)
}
