package sqlite

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// SchemaSQL is the DDL for the default table name, the same statements
// Migrate runs; schema.sql in this package holds it for migration tools.
//
//go:embed schema.sql
var SchemaSQL string

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
// One connection, because SQLite has one writer at a time anyway, and
// Go's pool hands its connection to waiters in turn, where SQLite's own
// busy handler makes waiting writers poll with sleeps of up to 100 ms: under
// sustained contention (the janitor draining a backlog while claims keep
// coming) a writer can miss every free moment for longer than the busy
// timeout and fail with SQLITE_BUSY. The price: inside an inbox handler,
// use the transaction from middleware.TxFromContext, never the *sql.DB —
// with one connection, a query on db waits for the very transaction that
// waits for it. Raise the limit with db.SetMaxOpenConns if your handlers
// need concurrent reads and you accept SQLITE_BUSY under contention.
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
	// database). Default: repository.DefaultTableName. It is validated
	// with repository.ValidateTableName.
	Table string
}

func (c *Config) setDefaults() {
	if c.Table == "" {
		c.Table = repository.DefaultTableName
	}
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error {
	return repository.ValidateTableName(c.Table)
}

// Repository stores inbox records in SQLite. Timestamps are stored as Unix
// microseconds. It implements repository.Transactional,
// repository.TwoPhase, repository.Reader and repository.Cleaner and is
// safe for concurrent use.
type Repository struct {
	db    *sql.DB
	table string // validated and quoted
	ddl   string

	claimSQL, selectSQL, saveSQL, deleteSQL string
	tp                                      twoPhaseSQL
}

// NewRepository returns a Repository over db, which should be opened with
// Open or DSN. It does not create the schema: call Migrate, or apply
// schema.sql with your migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	if db == nil {
		return nil, errors.New("sqlite: db is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	t, err := repository.QuoteTableName(config.Table, `"`)
	if err != nil {
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	r := &Repository{db: db, table: t, ddl: SchemaDDL(config.Table)}
	r.claimSQL = `INSERT INTO ` + t + ` (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES (?, ?, 'completed', ?, 1, ?, ?, ?)
ON CONFLICT (consumer, dedup_key) DO NOTHING`
	r.selectSQL = `SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM ` + t + ` WHERE consumer = ? AND dedup_key = ?`
	r.tp = newTwoPhaseSQL(t)
	r.saveSQL = `UPDATE ` + t + ` SET result = ? WHERE consumer = ? AND dedup_key = ?`
	r.deleteSQL = `DELETE FROM ` + t + ` WHERE rowid IN (
	SELECT rowid FROM ` + t + ` WHERE expires_at < ? ORDER BY expires_at LIMIT ?)`
	return r, nil
}

// SchemaDDL returns the statements Migrate runs for table, for callers who
// apply schema with their own migration tool. table must be valid (see
// repository.ValidateTableName).
func SchemaDDL(table string) string {
	t, _ := repository.QuoteTableName(table, `"`)
	// SQLite qualifies an index in an attached database by the index name,
	// and names the table unqualified.
	name, idx := table, `"`+repository.IndexName(table, "expires_at_idx")+`"`
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		name, idx = table[i+1:], `"`+table[:i]+`".`+idx
	}
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
    consumer     TEXT    NOT NULL,
    dedup_key    TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    payload_hash BLOB,
    result       BLOB,
    attempts     INTEGER NOT NULL DEFAULT 1,
    lease_owner  TEXT,
    lease_until  INTEGER,
    created_at   INTEGER NOT NULL,
    completed_at INTEGER,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (consumer, dedup_key)
);
CREATE INDEX IF NOT EXISTS ` + idx + ` ON "` + name + `" (expires_at);
`
}

// Migrate creates the inbox table and its index if they do not exist. It is
// idempotent.
func (r *Repository) Migrate(ctx context.Context) error {
	if _, err := r.db.ExecContext(ctx, r.ddl); err != nil {
		return fmt.Errorf("sqlite: migrate: %w", err)
	}
	return nil
}

func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}

// ClaimTx implements repository.Transactional with one
// INSERT … ON CONFLICT DO NOTHING; on conflict it reads the stored record
// in the same transaction.
func (r *Repository) ClaimTx(ctx context.Context, tx repository.Querier, p repository.ClaimParams) (repository.Claim, error) {
	if err := repository.ValidateClaim(p); err != nil {
		return repository.Claim{}, err
	}
	key := repository.StorageKey(p.Key)
	res, err := tx.ExecContext(ctx, r.claimSQL, p.Consumer, key, p.PayloadHash, micros(p.Now), micros(p.Now), micros(p.ExpiresAt))
	if err != nil {
		return repository.Claim{}, fmt.Errorf("sqlite: claim: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return repository.Claim{}, fmt.Errorf("sqlite: claim: %w", err)
	}
	if n == 1 {
		return repository.Claim{Claimed: true}, nil
	}
	rec, err := scan(tx.QueryRowContext(ctx, r.selectSQL, p.Consumer, key))
	if err != nil {
		return repository.Claim{}, fmt.Errorf("sqlite: read duplicate: %w", err)
	}
	return repository.Claim{Existing: rec}, nil
}

// SaveResultTx implements repository.Transactional.
func (r *Repository) SaveResultTx(ctx context.Context, tx repository.Querier, p repository.SaveResultParams) error {
	if err := repository.ValidateSaveResult(p); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, r.saveSQL, p.Result, p.Consumer, repository.StorageKey(p.Key))
	if err != nil {
		return fmt.Errorf("sqlite: save result: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("sqlite: save result: %w", err)
	} else if n == 0 {
		return fmt.Errorf("sqlite: save result: %w", repository.ErrNotFound)
	}
	return nil
}

// Get implements repository.Reader.
func (r *Repository) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	if err := repository.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	rec, err := scan(r.db.QueryRowContext(ctx, r.selectSQL, consumer, repository.StorageKey(key)))
	if err != nil {
		return repository.Record{}, fmt.Errorf("sqlite: get: %w", err)
	}
	return rec, nil
}

// DeleteExpired implements repository.Cleaner. Each batch is one short
// write transaction, so claims wait at most for one batch.
func (r *Repository) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("sqlite: delete expired: %w: limit must be positive", repository.ErrInvalidParams)
	}
	res, err := r.db.ExecContext(ctx, r.deleteSQL, micros(before), limit)
	if err != nil {
		return 0, fmt.Errorf("sqlite: delete expired: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("sqlite: delete expired: %w", err)
	}
	return int(n), nil
}

func scan(row *sql.Row) (repository.Record, error) {
	var (
		rec                                repository.Record
		state                              string
		owner                              sql.NullString
		leaseUntil, createdAt, completedAt sql.NullInt64
		expiresAt                          sql.NullInt64
	)
	err := row.Scan(&rec.Consumer, &rec.Key, &state, &rec.PayloadHash, &rec.Result, &rec.Attempts,
		&owner, &leaseUntil, &createdAt, &completedAt, &expiresAt)
	if errors.Is(err, sql.ErrNoRows) {
		return repository.Record{}, repository.ErrNotFound
	}
	if err != nil {
		return repository.Record{}, err
	}
	rec.State = repository.State(state)
	rec.LeaseOwner = owner.String
	rec.LeaseUntil = fromMicros(leaseUntil)
	rec.CreatedAt = fromMicros(createdAt)
	rec.CompletedAt = fromMicros(completedAt)
	rec.ExpiresAt = fromMicros(expiresAt)
	return rec, nil
}
