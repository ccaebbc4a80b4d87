package sqlite

import (
	"database/sql"
	"embed"
	"fmt"
	"net/url"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Migrations holds the schema as numbered migration files, inbox/ and
// versions/, for the default table names: Migrate applies them, and so can
// golang-migrate (one folder per migrations table).
//
//go:embed migrations
var Migrations embed.FS

var dialect = &sqlstore.Dialect{
	Name: "sqlite", Quote: `"`, Bind: sqlstore.QuestionNumbered, Migrations: Migrations,
	QualifyIndex:   true,
	IgnoreConflict: ` ON CONFLICT (consumer, dedup_key) DO NOTHING`,
	Returning:      true,
	// One writer at a time: nothing is ever locked by another writer.
	DeleteExpired: `DELETE FROM {T} WHERE rowid IN (SELECT rowid FROM {T} WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)`,
	EncodeTime:    func(t time.Time) (any, error) { return t.UnixMicro(), nil },
	DecodeTime: func(v any) (time.Time, error) {
		us, ok := v.(int64)
		if !ok {
			return time.Time{}, fmt.Errorf("sqlite: cannot scan %T into a timestamp", v)
		}
		return time.UnixMicro(us).UTC(), nil
	},
}

// DSN returns the modernc.org/sqlite data source name for the database file
// at path with the settings the inbox relies on: WAL journal, a 5 s busy
// timeout, and BEGIN IMMEDIATE for every transaction, so concurrent writers
// wait for the lock instead of failing mid-transaction. It also turns on
// foreign key enforcement, off by default in SQLite, so business
// constraints fail the inbox transaction as they would on a server.
func DSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "busy_timeout(5000)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

// Open opens the SQLite database file at path with DSN(path), limits the
// pool to one connection, and checks that the database answers.
//
// One connection, because SQLite has one writer anyway, and Go's pool
// hands its connection to waiters in turn, where SQLite's busy handler
// makes writers poll with sleeps of up to 100 ms: under sustained
// contention a writer can miss every free moment for longer than the busy
// timeout and fail with SQLITE_BUSY. The price: inside an inbox handler,
// use the transaction from middleware.TxFromContext, never the *sql.DB,
// which would wait for the very transaction that waits for it. Raise the
// limit with db.SetMaxOpenConns if you accept SQLITE_BUSY under contention.
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

type (
	// Config configures a Repository: Table is the inbox table
	// ("schema.table" addresses an attached database), default
	// repository.DefaultTableName.
	Config = sqlstore.Config
	// VersionConfig configures a VersionStore: Table defaults to
	// repository.DefaultVersionsTableName.
	VersionConfig = sqlstore.Config
	// Repository stores inbox records in SQLite, timestamps as Unix
	// microseconds. It implements repository.Transactional, TwoPhase,
	// Reader, Cleaner, Operator and Stats and is safe for concurrent use.
	Repository = sqlstore.Inbox
	// VersionStore keeps the last applied version per (consumer, entity)
	// in SQLite. A transaction opened with the DSN's BEGIN IMMEDIATE holds
	// the write lock from its start, so transactions on one entity run in
	// turn.
	VersionStore = sqlstore.Versions
)

// NewRepository returns a Repository over db, opened with Open or DSN. It
// does not create the schema: call Migrate, or apply Migrations with your
// migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	return sqlstore.NewInbox(dialect, sqlstore.StdDB(db), config)
}

// NewVersionStore returns a VersionStore over db; like NewRepository, it
// does not create the table.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
	return sqlstore.NewVersions(dialect, sqlstore.StdDB(db), config)
}
