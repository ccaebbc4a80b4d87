package postgres

import (
	"database/sql"
	"embed"

	"github.com/jackc/pgx/v5"
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

// Repository stores inbox records in PostgreSQL, for transactions of
// type TTx: *sql.Tx (NewRepository, database/sql) or pgx.Tx
// (NewPgxRepository, pgx/v5). It is the repository.Driver the
// transactional inbox, once.NewTransactional and the version guard take,
// and implements repository.TwoPhase, Reader, Cleaner, Operator and Stats
// for every other entry point. Its repository.Driver methods (Begin,
// BeginClaim, Claim, SaveResult, Commit, Rollback, Retryable, Reserve,
// Get) are documented there. Both drivers send the same statements. It
// is safe for concurrent use.
type Repository[TTx any] struct {
	driver[TTx]
	s *sqlstore.Inbox
}

// driver is the repository.Driver half of a repository: the claim, the
// result and the transactions (see internal/sqlstore.Driver).
type driver[TTx any] = sqlstore.Driver[TTx]

// VersionStore keeps the last applied version per (consumer, entity) in
// PostgreSQL, in transactions of type TTx as Repository does. It
// implements repository.VersionGuard and is safe for concurrent use.
// Rows never expire (an old version could apply again): delete one when
// the entity itself is deleted.
type VersionStore[TTx any] struct {
	s   *sqlstore.Versions
	txs sqlstore.Txs[TTx]
}

// NewRepository returns a Repository over db (database/sql, pgx stdlib
// driver): its transactions are *sql.Tx, begun with the driver's default
// options. It does not create the schema: call Migrate, or apply
// Migrations with your migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository[*sql.Tx], error) {
	return newRepository(sqlstore.StdDB(db), sqlstore.Txs[*sql.Tx](sqlstore.StdTxs{DB: db}), config)
}

// NewVersionStore returns a VersionStore over db; like NewRepository, it
// does not create the table.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore[*sql.Tx], error) {
	return newVersionStore(sqlstore.StdDB(db), sqlstore.Txs[*sql.Tx](sqlstore.StdTxs{DB: db}), config)
}

// NewPgxRepository returns a Repository over a pgx/v5 pool: its
// statements run natively on pgx and its transactions are pgx.Tx, so a
// handler's pgx code (sqlc's pgx mode included) writes in the inbox's
// transaction (idempotency.Tx[pgx.Tx]). A first delivery costs the round
// trips of the handler's own transaction: BEGIN and the claim go out
// together in one pgx.Batch, then the handler's statements, then COMMIT.
func NewPgxRepository(pool *pgxpool.Pool, config Config) (*Repository[pgx.Tx], error) {
	return newRepository(pgxexec.Pool(pool), sqlstore.Txs[pgx.Tx](pgxTxs{pool: pool}), config)
}

// NewPgxVersionStore returns a VersionStore over a pgx/v5 pool.
func NewPgxVersionStore(pool *pgxpool.Pool, config VersionConfig) (*VersionStore[pgx.Tx], error) {
	return newVersionStore(pgxexec.Pool(pool), sqlstore.Txs[pgx.Tx](pgxTxs{pool: pool}), config)
}

// newRepository and newVersionStore make the stores on either driver.
func newRepository[TTx any](db sqlstore.DB, txs sqlstore.Txs[TTx], config Config) (*Repository[TTx], error) {
	s, err := sqlstore.NewInbox(dialect, db, sqlstore.Config(config))
	return sqlstore.OrNil(&Repository[TTx]{driver: sqlstore.NewDriver[TTx](s, txs), s: s}, err)
}

func newVersionStore[TTx any](db sqlstore.DB, txs sqlstore.Txs[TTx], config VersionConfig) (*VersionStore[TTx], error) {
	s, err := sqlstore.NewVersions(dialect, db, sqlstore.Config(config))
	return sqlstore.OrNil(&VersionStore[TTx]{s: s, txs: txs}, err)
}
