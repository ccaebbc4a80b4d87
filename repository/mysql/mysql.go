package mysql

import (
	"database/sql"
	"embed"
	"errors"
	"slices"
	"strconv"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Migrations holds the schema as numbered migration files, inbox/ and
// versions/, for the default table names: Migrate applies them, and so can
// golang-migrate (one folder per migrations table; its DSN needs
// multiStatements=true).
//
//go:embed migrations
var Migrations embed.FS

// MaxPayloadHashLength is the longest payload hash, in bytes, that the
// payload_hash column holds. A SHA-256 (repository.HashPayload) is 32.
const MaxPayloadHashLength = 255

// Dialect names this database to the outbox, so a program names it once:
// outbox.Config{Dialect: mysql.Dialect}.
const Dialect = sqldialect.MySQL

var dialect = sqlstore.MySQL.With(Migrations, func(err error) string {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return strconv.Itoa(int(me.Number))
	}
	return ""
})

// Config configures a Repository.
type Config struct {
	// Table is the inbox table, optionally "database.table", validated by
	// repository.ValidateTableName. Default: repository.DefaultTableName.
	Table string
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error { return sqlstore.Config(c).Validate() }

// VersionConfig configures a VersionStore: Table defaults to
// repository.DefaultVersionsTableName.
type VersionConfig = Config

// Repository stores inbox records in MySQL or MariaDB (InnoDB). It is
// the repository.Driver[*sql.Tx] the transactional inbox takes (its
// Driver methods are documented there), implements repository.TwoPhase,
// Reader, Cleaner, Operator and Stats and is safe for concurrent use.
// Every value is checked to fit its column before it is sent (keys and
// consumers of at most 255 bytes, payload hashes of at most
// MaxPayloadHashLength, times in years 1000 to 9999), so none is ever
// truncated, even under a non-strict sql_mode.
type Repository struct {
	driver
	s *sqlstore.Inbox
}

// driver is the repository.Driver half of a repository: the claim, the
// result and the transactions (see internal/sqlstore.Driver).
type driver = sqlstore.Driver[*sql.Tx]

// VersionStore keeps the last applied version per (consumer, entity) in
// MySQL or MariaDB (InnoDB). It implements repository.VersionGuard and is
// safe for concurrent use. Rows never expire (an old version could apply
// again): delete one when the entity itself is deleted.
type VersionStore struct {
	s *sqlstore.Versions
}

// NewRepository returns a Repository over db; any DSN works. It does not
// create the schema: call Migrate, or apply Migrations with your
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

// init teaches repository.IsUniqueViolation and IsDataException
// *mysql.MySQLError, which has no method they could recognise it by.
func init() {
	repository.RegisterUniqueViolation(IsUniqueViolation)
	repository.RegisterDataException(IsDataException)
}

// IsUniqueViolation reports whether err, or any error it wraps, is a
// MySQL/MariaDB unique-key violation, by number: 1062 (ER_DUP_ENTRY), 1586
// (ER_DUP_ENTRY_WITH_KEY_NAME) or 1022 (ER_DUP_KEY). It is the one list
// the repository uses; importing this package registers it.
func IsUniqueViolation(err error) bool { return hasNumber(err, 1062, 1586, 1022) }

// IsDataException reports whether err, or any error it wraps, is a
// MySQL/MariaDB error about a value of the statement, by code: SQLSTATE
// class 22 (1406 data too long, 1264 out of range, 1292 incorrect
// datetime, …), 1366 or 1300 (bad value or character string, reported
// under HY000). Importing this package registers it.
func IsDataException(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.SQLState[0] == '2' && me.SQLState[1] == '2' || hasNumber(err, 1366, 1300)
}

func hasNumber(err error, numbers ...uint16) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && slices.Contains(numbers, me.Number)
}
