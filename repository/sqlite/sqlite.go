package sqlite

import (
	"database/sql"
	"embed"
	"fmt"
	"net/url"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/sqldialect"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Migrations holds the schema as numbered migration files, inbox/ and
// versions/, for the default table names: Migrate applies them, and so can
// golang-migrate (one folder per migrations table).
//
//go:embed migrations
var Migrations embed.FS

// Dialect names this database to the outbox, so a program names it once:
// outbox.Config{Dialect: sqlite.Dialect}.
const Dialect = sqldialect.SQLite

var dialect = sqlstore.SQLite.With(Migrations, nil)

// DSN returns the modernc.org/sqlite data source name for the file at path
// with the settings the inbox relies on: WAL, a 5 s busy timeout, BEGIN
// IMMEDIATE for every transaction (writers wait for the lock instead of
// failing mid-transaction), and foreign keys enforced, as on a server.
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// Open opens the SQLite database file at path with DSN(path) and one
// connection, and checks that it answers. One connection, because SQLite
// has one writer anyway: waiters queue in Go's pool instead of polling
// SQLite's lock, which under sustained contention can miss every free
// moment for longer than the busy timeout (SQLITE_BUSY). So inside a
// handler use the transaction from idempotency.Tx[*sql.Tx], never the
// *sql.DB, which would wait for the transaction waiting for it.
func Open(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", DSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	return db, nil
}

// Config configures a Repository.
type Config struct {
	// Table is the inbox table ("schema.table" addresses an attached
	// database), validated by repository.ValidateTableName. Default:
	// repository.DefaultTableName.
	Table string
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error { return sqlstore.Config(c).Validate() }

// VersionConfig configures a VersionStore: Table defaults to
// repository.DefaultVersionsTableName.
type VersionConfig = Config

// Repository stores inbox records in SQLite, timestamps as Unix
// microseconds. It is the repository.Driver[*sql.Tx] the transactional
// inbox takes (its Driver methods are documented there), implements
// repository.TwoPhase, Reader, Cleaner, Operator and Stats and is safe
// for concurrent use.
type Repository struct {
	driver
	s *sqlstore.Inbox
}

// driver is the repository.Driver half of a repository: the claim, the
// result and the transactions (see internal/sqlstore.Driver).
type driver = sqlstore.Driver[*sql.Tx]

// VersionStore keeps the last applied version per (consumer, entity) in
// SQLite. It implements repository.VersionGuard and is safe for
// concurrent use. Rows never expire (an old version could apply again):
// delete one when the entity itself is deleted.
type VersionStore struct {
	s *sqlstore.Versions
}

// NewRepository returns a Repository over db, opened with Open or DSN. It
// does not create the schema: call Migrate, or apply Migrations with your
// migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	s, err := sqlstore.NewInbox(dialect, sqlstore.StdDB(db), sqlstore.Config(config))
	return sqlstore.OrNil(&Repository{driver: sqlstore.NewDriver[*sql.Tx](s, sqlstore.StdTxs{DB: db}), s: s}, err)
}

// NewVersionStore returns a VersionStore over db; like NewRepository, it
// does not create the table.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
	s, err := sqlstore.NewVersions(dialect, sqlstore.StdDB(db), sqlstore.Config(config))
	return sqlstore.OrNil(&VersionStore{s}, err)
}
