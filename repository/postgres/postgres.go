package postgres

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// SchemaSQL is the DDL for the default table name, the same statements
// Migrate runs; schema.sql in this package holds it for migration tools.
//
//go:embed schema.sql
var SchemaSQL string

// Config configures a Repository.
type Config struct {
	// Table is the inbox table, optionally schema-qualified
	// ("schema.table"). Default: repository.DefaultTableName. It is
	// validated with repository.ValidateTableName.
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

// Repository stores inbox records in PostgreSQL. It implements
// repository.Transactional, repository.TwoPhase, repository.Reader and
// repository.Cleaner and is safe for concurrent use.
type Repository struct {
	db    *sql.DB
	table string // validated and quoted
	ddl   string

	claimSQL, selectSQL, saveSQL, deleteSQL string
	tp                                      twoPhaseSQL
}

// NewRepository returns a Repository over db. It does not create the
// schema: call Migrate, or apply schema.sql with your migration tool.
func NewRepository(db *sql.DB, config Config) (*Repository, error) {
	if db == nil {
		return nil, errors.New("postgres: db is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	t, err := repository.QuoteTableName(config.Table, `"`)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	r := &Repository{db: db, table: t, ddl: SchemaDDL(config.Table)}
	r.claimSQL = `INSERT INTO ` + t + ` (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
VALUES ($1, $2, 'completed', $3, 1, $4, $4, $5)
ON CONFLICT (consumer, dedup_key) DO NOTHING`
	r.selectSQL = `SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM ` + t + ` WHERE consumer = $1 AND dedup_key = $2`
	r.tp = newTwoPhaseSQL(t)
	r.saveSQL = `UPDATE ` + t + ` SET result = $3 WHERE consumer = $1 AND dedup_key = $2`
	r.deleteSQL = `DELETE FROM ` + t + ` WHERE (consumer, dedup_key) IN (
	SELECT consumer, dedup_key FROM ` + t + ` WHERE expires_at < $1
	ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`
	return r, nil
}

// SchemaDDL returns the statements Migrate runs for table, for callers who
// apply schema with their own migration tool. table must be valid (see
// repository.ValidateTableName).
func SchemaDDL(table string) string {
	t, _ := repository.QuoteTableName(table, `"`)
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
    consumer     VARCHAR(255) NOT NULL,
    dedup_key    VARCHAR(255) NOT NULL,
    state        VARCHAR(16)  NOT NULL,
    payload_hash BYTEA,
    result       BYTEA,
    attempts     INTEGER      NOT NULL DEFAULT 1,
    lease_owner  VARCHAR(255),
    lease_until  TIMESTAMPTZ,
    created_at   TIMESTAMPTZ  NOT NULL,
    completed_at TIMESTAMPTZ,
    expires_at   TIMESTAMPTZ  NOT NULL,
    PRIMARY KEY (consumer, dedup_key)
);
CREATE INDEX IF NOT EXISTS "` + repository.IndexName(table, "expires_at_idx") + `" ON ` + t + ` (expires_at);
`
}

// Migrate creates the inbox table and its index if they do not exist. It
// is idempotent and takes an advisory lock so that several processes
// starting at once do not race on the DDL.
func (r *Repository) Migrate(ctx context.Context) error {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	defer conn.Close()
	// Concurrent CREATE … IF NOT EXISTS can still fail on the catalog's
	// unique index; serialize migrations with a transaction-level lock.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('watermill-idempotent-migrate'))`); err != nil {
		return fmt.Errorf("postgres: migrate lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, r.ddl); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("postgres: migrate commit: %w", err)
	}
	return nil
}

// ClaimTx implements repository.Transactional with one
// INSERT … ON CONFLICT DO NOTHING; on conflict it reads the stored record
// in the same transaction.
func (r *Repository) ClaimTx(ctx context.Context, tx repository.Querier, p repository.ClaimParams) (repository.Claim, error) {
	if err := repository.ValidateClaim(p); err != nil {
		return repository.Claim{}, err
	}
	key := repository.StorageKey(p.Key)
	res, err := tx.ExecContext(ctx, r.claimSQL, p.Consumer, key, p.PayloadHash, p.Now.UTC(), p.ExpiresAt.UTC())
	if err != nil {
		return repository.Claim{}, fmt.Errorf("postgres: claim: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return repository.Claim{}, fmt.Errorf("postgres: claim: %w", err)
	}
	if n == 1 {
		return repository.Claim{Claimed: true}, nil
	}
	rec, err := r.scan(tx.QueryRowContext(ctx, r.selectSQL, p.Consumer, key))
	if err != nil {
		// The conflicting row was there for the insert; not finding it now
		// means it was deleted in between (cleanup). Report it rather than
		// guess: the broker retries and the next claim decides.
		return repository.Claim{}, fmt.Errorf("postgres: read duplicate: %w", err)
	}
	return repository.Claim{Existing: rec}, nil
}

// SaveResultTx implements repository.Transactional.
func (r *Repository) SaveResultTx(ctx context.Context, tx repository.Querier, p repository.SaveResultParams) error {
	if err := repository.ValidateSaveResult(p); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, r.saveSQL, p.Consumer, repository.StorageKey(p.Key), p.Result)
	if err != nil {
		return fmt.Errorf("postgres: save result: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("postgres: save result: %w", err)
	} else if n == 0 {
		return fmt.Errorf("postgres: save result: %w", repository.ErrNotFound)
	}
	return nil
}

// Get implements repository.Reader.
func (r *Repository) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	if err := repository.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	rec, err := r.scan(r.db.QueryRowContext(ctx, r.selectSQL, consumer, repository.StorageKey(key)))
	if err != nil {
		return repository.Record{}, fmt.Errorf("postgres: get: %w", err)
	}
	return rec, nil
}

// DeleteExpired implements repository.Cleaner.
func (r *Repository) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("postgres: delete expired: %w: limit must be positive", repository.ErrInvalidParams)
	}
	res, err := r.db.ExecContext(ctx, r.deleteSQL, before.UTC(), limit)
	if err != nil {
		return 0, fmt.Errorf("postgres: delete expired: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("postgres: delete expired: %w", err)
	}
	return int(n), nil
}

func (r *Repository) scan(row *sql.Row) (repository.Record, error) {
	var (
		rec                     repository.Record
		state                   string
		owner                   sql.NullString
		leaseUntil, completedAt sql.NullTime
	)
	err := row.Scan(&rec.Consumer, &rec.Key, &state, &rec.PayloadHash, &rec.Result, &rec.Attempts,
		&owner, &leaseUntil, &rec.CreatedAt, &completedAt, &rec.ExpiresAt)
	if errors.Is(err, sql.ErrNoRows) {
		return repository.Record{}, repository.ErrNotFound
	}
	if err != nil {
		return repository.Record{}, err
	}
	rec.State = repository.State(state)
	rec.LeaseOwner = owner.String
	rec.LeaseUntil = leaseUntil.Time
	rec.CompletedAt = completedAt.Time
	return rec, nil
}
