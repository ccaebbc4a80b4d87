package postgres

import (
	"database/sql"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/internal/sqlstore/pgxexec"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Migrations holds the schema as numbered migration files, inbox/ and
// versions/, for the default table names: Migrate applies them, and so can
// golang-migrate (one folder per migrations table).
//
//go:embed migrations
var Migrations embed.FS

// Dialect names this database to the outbox, so a program names it once:
// outbox.Config{Dialect: postgres.Dialect}.
const Dialect = sqldialect.PostgreSQL

var dialect = sqlstore.Postgres.With(Migrations, nil)

type (
	// Config configures a Repository: Table is the inbox table, optionally
	// schema-qualified, default repository.DefaultTableName.
	Config = sqlstore.Config
	// VersionConfig configures a VersionStore: Table defaults to
	// repository.DefaultVersionsTableName.
	VersionConfig = sqlstore.Config
	// Repository stores inbox records in PostgreSQL. It implements
	// repository.Transactional, BatchTransactional, TwoPhase, Reader,
	// Cleaner, Operator and Stats and is safe for concurrent use.
	Repository = sqlstore.Inbox
	// VersionStore keeps the last applied version per (consumer, entity)
	// in PostgreSQL. Under READ COMMITTED a concurrent transaction on one
	// entity waits for the row lock, then compares against the committed
	// version; under REPEATABLE READ or SERIALIZABLE it fails with SQLSTATE
	// 40001 instead: retry.
	VersionStore = sqlstore.Versions
)

// NewRepository returns a Repository over db (database/sql, pgx stdlib
// driver). It does not create the schema: call Migrate, or apply
// Migrations with your migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	return sqlstore.NewInbox(dialect, sqlstore.StdDB(db), config)
}

// NewVersionStore returns a VersionStore over db; like NewRepository, it
// does not create the table.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
	return sqlstore.NewVersions(dialect, sqlstore.StdDB(db), config)
}

// NewPgxRepository returns a Repository that runs its own statements
// natively on a pgx/v5 pool. For the transactional inbox on pgx
// transactions use middleware/pgxinbox; ClaimTx and SaveResultTx still
// take a database/sql transaction.
func NewPgxRepository(pool *pgxpool.Pool, config Config) (*Repository, error) {
	return sqlstore.NewInbox(dialect, pgxexec.Pool(pool), config)
}

// NewPgxVersionStore returns a VersionStore over a pgx/v5 pool.
func NewPgxVersionStore(pool *pgxpool.Pool, config VersionConfig) (*VersionStore, error) {
	return sqlstore.NewVersions(dialect, pgxexec.Pool(pool), config)
}
