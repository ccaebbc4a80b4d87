package postgres

import (
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/internal/sqlstore/pgxexec"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Migrations holds the schema as numbered migration files, inbox/ and
// versions/, written for the default table names: Migrate applies them,
// and so can golang-migrate (one folder per migrations table).
//
//go:embed migrations
var Migrations embed.FS

var dialect = &sqlstore.Dialect{
	Name:       "postgres",
	Quote:      `"`,
	Bind:       sqlstore.Dollar,
	Migrations: Migrations,
	// The lock every migration line takes, the outbox's too.
	MigrateLock:    sqlstore.PostgresMigrateLock,
	IgnoreConflict: ` ON CONFLICT (consumer, dedup_key) DO NOTHING`,
	ByteOrder:      ` COLLATE "C"`,
	Returning:      true,
	DeleteExpired: `DELETE FROM {T} WHERE (consumer, dedup_key) IN (
	SELECT consumer, dedup_key FROM {T} WHERE expires_at < $1
	ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`,
	EncodeTime: func(t time.Time) (any, error) { return t.UTC(), nil },
	DecodeTime: func(v any) (time.Time, error) {
		t, ok := v.(time.Time)
		if !ok {
			return t, fmt.Errorf("postgres: cannot scan %T into a timestamp", v)
		}
		return t, nil
	},
	IsUniqueViolation: repository.IsUniqueViolation,
	IsRetryable: func(err error) bool {
		var pg interface{ SQLState() string }
		return errors.As(err, &pg) && pg.SQLState() == "40P01" // deadlock_detected
	},
}

// Config configures a Repository (see sqlstore.Config): Table is the
// inbox table, optionally schema-qualified, default
// repository.DefaultTableName.
type Config = sqlstore.Config

// VersionConfig configures a VersionStore: Table is the versions table,
// default repository.DefaultVersionsTableName.
type VersionConfig = sqlstore.Config

// Repository stores inbox records in PostgreSQL. It implements
// repository.Transactional, TwoPhase, Reader, Cleaner, Operator and Stats
// and is safe for concurrent use.
type Repository = sqlstore.Inbox

// VersionStore keeps the last applied version per (consumer, entity) in
// PostgreSQL; it implements repository.VersionGuard. Under READ COMMITTED
// (the default) a concurrent transaction on one entity waits for the row
// lock and then compares against the committed version; under REPEATABLE
// READ or SERIALIZABLE it fails with SQLSTATE 40001 instead: retry.
type VersionStore = sqlstore.Versions

// NewRepository returns a Repository over db (database/sql with the pgx
// stdlib driver). It does not create the schema: call Migrate, or apply
// the files in Migrations with your migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	return sqlstore.NewInbox(dialect, sqlstore.StdDB(db), config)
}

// NewVersionStore returns a VersionStore over db. It does not create the
// table: call Migrate, or apply Migrations' versions/ files.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
	return sqlstore.NewVersions(dialect, sqlstore.StdDB(db), config)
}

// NewPgxRepository returns a Repository over a pgx/v5 pool: every
// statement the store runs on its own goes through pool natively. For the
// transactional inbox on pgx transactions use middleware/pgxinbox, which
// claims on the handler's pgx.Tx; ClaimTx and SaveResultTx still take a
// database/sql transaction. It does not create the schema: call Migrate,
// or apply the files in Migrations with your migration tool.
func NewPgxRepository(pool *pgxpool.Pool, config Config) (*Repository, error) {
	return sqlstore.NewInbox(dialect, pgxexec.Pool(pool), config)
}

// NewPgxVersionStore returns a VersionStore over a pgx/v5 pool (see
// NewPgxRepository).
func NewPgxVersionStore(pool *pgxpool.Pool, config VersionConfig) (*VersionStore, error) {
	return sqlstore.NewVersions(dialect, pgxexec.Pool(pool), config)
}
