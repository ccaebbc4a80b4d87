package sqlite

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
	// Table is the versions table ("schema.table" addresses an attached
	// database). Default: repository.DefaultVersionsTableName. It is
	// validated with repository.ValidateTableName.
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
// SQLite. It implements repository.VersionGuard and is safe for
// concurrent use. Rows never expire: deleting one would let an old version
// apply again; delete it when the entity itself is deleted.
type VersionStore struct {
	db                       *sql.DB
	ddl, advanceSQL, lastSQL string
}

// NewVersionStore returns a VersionStore over db, which should be opened
// with Open or DSN. It does not create the table: call Migrate, or apply
// versions.sql with your migration tool.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
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
	// In an upsert, an unqualified column names the target row and
	// excluded.column the proposed one.
	return &VersionStore{
		db:  db,
		ddl: VersionsSchemaDDL(config.Table),
		advanceSQL: `INSERT INTO ` + t + ` (consumer, entity, version) VALUES (?1, ?2, ?3)
ON CONFLICT (consumer, entity) DO UPDATE SET version = excluded.version WHERE version < excluded.version`,
		lastSQL: `SELECT version FROM ` + t + ` WHERE consumer = ?1 AND entity = ?2`,
	}, nil
}

// VersionsSchemaDDL returns the statement VersionStore.Migrate runs for
// table. table must be valid (see repository.ValidateTableName).
func VersionsSchemaDDL(table string) string {
	t, _ := repository.QuoteTableName(table, `"`)
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
    consumer TEXT    NOT NULL,
    entity   TEXT    NOT NULL,
    version  INTEGER NOT NULL,
    PRIMARY KEY (consumer, entity)
);
`
}

// Migrate creates the versions table if it does not exist. It is
// idempotent.
func (s *VersionStore) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.ddl); err != nil {
		return fmt.Errorf("sqlite: migrate versions: %w", err)
	}
	return nil
}

// AdvanceTx implements repository.VersionGuard with one
// INSERT … ON CONFLICT DO UPDATE … WHERE stored < new: one row changed
// means applied, none means stale. SQLite has one writer at a time, and a
// transaction opened with the DSN's BEGIN IMMEDIATE holds the write lock
// from its start, so transactions on the same entity run one after the
// other.
func (s *VersionStore) AdvanceTx(ctx context.Context, tx repository.Querier, p repository.AdvanceParams) (bool, error) {
	stored, err := repository.PrepareAdvance(p)
	if err != nil {
		return false, err
	}
	res, err := tx.ExecContext(ctx, s.advanceSQL, stored.Consumer, stored.Entity, stored.Version)
	if err != nil {
		return false, fmt.Errorf("sqlite: advance version of %q: %w", p.Entity, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("sqlite: advance version of %q: %w", p.Entity, err)
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
		return 0, fmt.Errorf("sqlite: last version of %q: %w", entity, repository.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("sqlite: last version of %q: %w", entity, err)
	}
	return v, nil
}

var _ repository.VersionGuard = (*VersionStore)(nil)
