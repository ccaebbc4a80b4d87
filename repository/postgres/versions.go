package postgres

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"

	"github.com/idemkit/watermill-idempotent/repository"
)

// VersionsSchemaSQL is the DDL of the version guard's table for the
// default name, the statement VersionStore.Migrate runs; versions.sql in
// this package holds it for migration tools.
//
//go:embed versions.sql
var VersionsSchemaSQL string

// VersionConfig configures a VersionStore.
type VersionConfig struct {
	// Table is the versions table, optionally schema-qualified. Default:
	// repository.DefaultVersionsTableName. It is validated with
	// repository.ValidateTableName.
	Table string
}

func (c *VersionConfig) setDefaults() {
	if c.Table == "" {
		c.Table = repository.DefaultVersionsTableName
	}
}

// Validate reports whether the configuration is usable.
func (c VersionConfig) Validate() error {
	return repository.ValidateTableName(c.Table)
}

// VersionStore keeps the last applied version per (consumer, entity) in
// PostgreSQL. It implements repository.VersionGuard and is safe for
// concurrent use. Rows never expire: deleting one would let an old version
// apply again; delete it when the entity itself is deleted.
type VersionStore struct {
	db                       *sql.DB
	ddl, advanceSQL, lastSQL string
}

// NewVersionStore returns a VersionStore over db. It does not create the
// table: call Migrate, or apply versions.sql with your migration tool.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
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
	return &VersionStore{
		db:  db,
		ddl: VersionsSchemaDDL(config.Table),
		advanceSQL: `INSERT INTO ` + t + ` AS v (consumer, entity, version) VALUES ($1, $2, $3)
ON CONFLICT (consumer, entity) DO UPDATE SET version = excluded.version WHERE v.version < excluded.version`,
		lastSQL: `SELECT version FROM ` + t + ` WHERE consumer = $1 AND entity = $2`,
	}, nil
}

// VersionsSchemaDDL returns the statement VersionStore.Migrate runs for
// table. table must be valid (see repository.ValidateTableName).
func VersionsSchemaDDL(table string) string {
	t, _ := repository.QuoteTableName(table, `"`)
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
    consumer VARCHAR(255) NOT NULL,
    entity   VARCHAR(255) NOT NULL,
    version  BIGINT       NOT NULL,
    PRIMARY KEY (consumer, entity)
);
`
}

// Migrate creates the versions table if it does not exist. It is
// idempotent and serialised across processes like Repository.Migrate.
func (s *VersionStore) Migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("postgres: migrate versions: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('watermill-idempotent-migrate'))`); err != nil {
		return fmt.Errorf("postgres: migrate versions lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, s.ddl); err != nil {
		return fmt.Errorf("postgres: migrate versions: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("postgres: migrate versions commit: %w", err)
	}
	return nil
}

// AdvanceTx implements repository.VersionGuard with one
// INSERT … ON CONFLICT DO UPDATE … WHERE stored < new: one row affected
// means applied, none means stale. Under READ COMMITTED (PostgreSQL's
// default) a concurrent transaction on the same entity waits for the row
// lock and then re-checks the condition against the committed version.
// Under REPEATABLE READ or SERIALIZABLE it fails with a serialization
// error instead (SQLSTATE 40001); roll back and retry.
func (s *VersionStore) AdvanceTx(ctx context.Context, tx repository.Querier, p repository.AdvanceParams) (bool, error) {
	stored, err := repository.PrepareAdvance(p)
	if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, s.advanceSQL, stored.Consumer, stored.Entity, stored.Version)
	if err != nil {
		return false, fmt.Errorf("postgres: advance version of %q: %w", p.Entity, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("postgres: advance version of %q: %w", p.Entity, err)
	}
	return n == 1, nil
}

// LastVersion returns the last applied version of (consumer, entity), or
// repository.ErrNotFound if none was applied. entity is the one given to
// AdvanceTx; it is looked up in its stored form (repository.StorageKey).
func (s *VersionStore) LastVersion(ctx context.Context, consumer, entity string) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, s.lastSQL, consumer, repository.StorageKey(entity)).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("postgres: last version of %q: %w", entity, repository.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("postgres: last version of %q: %w", entity, err)
	}
	return v, nil
}

var _ repository.VersionGuard = (*VersionStore)(nil)
