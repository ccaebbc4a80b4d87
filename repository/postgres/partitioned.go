package postgres

import (
	"database/sql"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
)

// PartitionedConfig configures a PartitionedRepository.
type PartitionedConfig struct {
	// Table is the inbox table, optionally "schema.table". Default
	// repository.DefaultTableName.
	Table string
	// Interval is the span of expires_at one partition holds; cleanup
	// removes records a whole interval at a time, so a record outlives its
	// ExpiresAt by up to one Interval. It must divide 24 hours and be at
	// least a minute, so partitions start at the same UTC times in every
	// process. Default 24 hours.
	Interval time.Duration
	// Ahead is how far past now Migrate and every DeleteExpired create
	// partitions, so that claims find theirs ready. Make it exceed the
	// inbox retention; a claim expiring past it creates its partition
	// itself, in the claim's transaction. Default 8 days.
	Ahead time.Duration
}

// Validate reports whether the configuration is usable.
func (c PartitionedConfig) Validate() error { return sqlstore.PartitionConfig(c).Validate() }

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
// It is a repository.Driver[*sql.Tx], implements repository.TwoPhase,
// Reader, Cleaner, Operator and Stats and is safe for concurrent use. See
// docs/partitioning.md for the measurements and for pg_partman.
type PartitionedRepository struct {
	driver[*sql.Tx]
	s *sqlstore.PartitionedInbox
}

// NewPartitionedRepository returns a PartitionedRepository over db. Call
// Migrate to create the partitioned table (migration line
// migrations/partitioned_inbox) and its first partitions; the table must
// not be one NewRepository created.
func NewPartitionedRepository(db *sql.DB, config PartitionedConfig) (*PartitionedRepository, error) {
	s, err := sqlstore.NewPartitionedInbox(dialect, sqlstore.StdDB(db), sqlstore.PartitionConfig(config))
	return sqlstore.OrNil(&PartitionedRepository{driver: sqlstore.NewDriver[*sql.Tx](s, sqlstore.StdTxs{DB: db}), s: s}, err)
}
