package postgres

import (
	"database/sql"
	"embed"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/sqldialect"
	"github.com/idemkit/watermill-idempotent/sqlexec/pgxexec"
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

// Config configures a Repository.
type Config struct {
	// Table is the inbox table, optionally "schema.table", validated by
	// repository.ValidateTableName. Default: repository.DefaultTableName.
	Table string
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error { return sqlstore.Config(c).Validate() }

// VersionConfig configures a VersionStore: Table defaults to
// repository.DefaultVersionsTableName.
type VersionConfig = Config

// Repository stores inbox records in PostgreSQL. It implements
// repository.Transactional, BatchTransactional, TwoPhase, Reader,
// Cleaner, Operator and Stats and is safe for concurrent use.
type Repository struct{ s *sqlstore.Inbox }

// VersionStore keeps the last applied version per (consumer, entity) in
// PostgreSQL. It implements repository.VersionGuard and is safe for
// concurrent use. Rows never expire (an old version could apply again):
// delete one when the entity itself is deleted.
type VersionStore struct{ s *sqlstore.Versions }

// NewRepository returns a Repository over db (database/sql, pgx stdlib
// driver). It does not create the schema: call Migrate, or apply
// Migrations with your migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	return newRepository(sqlstore.StdDB(db), config)
}

// NewVersionStore returns a VersionStore over db; like NewRepository, it
// does not create the table.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
	return newVersionStore(sqlstore.StdDB(db), config)
}

// NewPgxRepository returns a Repository that runs its own statements
// natively on a pgx/v5 pool. For the transactional inbox on pgx
// transactions use middleware/pgxinbox; ClaimTx and SaveResultTx still
// take a database/sql transaction.
func NewPgxRepository(pool *pgxpool.Pool, config Config) (*Repository, error) {
	return newRepository(pgxexec.Pool(pool), config)
}

// NewPgxVersionStore returns a VersionStore over a pgx/v5 pool.
func NewPgxVersionStore(pool *pgxpool.Pool, config VersionConfig) (*VersionStore, error) {
	return newVersionStore(pgxexec.Pool(pool), config)
}

// newRepository and newVersionStore make the stores on either driver's
// pool.
func newRepository(db sqlstore.DB, config Config) (*Repository, error) {
	s, err := sqlstore.NewInbox(dialect, db, sqlstore.Config(config))
	return sqlstore.OrNil(&Repository{s}, err)
}

func newVersionStore(db sqlstore.DB, config VersionConfig) (*VersionStore, error) {
	s, err := sqlstore.NewVersions(dialect, db, sqlstore.Config(config))
	return sqlstore.OrNil(&VersionStore{s}, err)
}
