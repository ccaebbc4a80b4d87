package mysql

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strings"

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
	// Table is the versions table, optionally database-qualified. Default:
	// repository.DefaultVersionsTableName. It is validated with
	// repository.ValidateTableName and quoted with backticks.
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
// MySQL or MariaDB (InnoDB). It implements repository.VersionGuard and is
// safe for concurrent use. Consumer and entity are VARBINARY(255),
// compared byte for byte like the inbox's keys. Rows never expire:
// deleting one would let an old version apply again; delete it when the
// entity itself is deleted.
type VersionStore struct {
	db                                *sql.DB
	ddl, lockSQL, advanceSQL, lastSQL string
}

// NewVersionStore returns a VersionStore over db. It does not create the
// table: call Migrate, or apply versions.sql with your migration tool.
func NewVersionStore(db *sql.DB, config VersionConfig) (*VersionStore, error) {
	if db == nil {
		return nil, errors.New("mysql: db is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	t, err := repository.QuoteTableName(config.Table, "`")
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	return &VersionStore{
		db:  db,
		ddl: VersionsSchemaDDL(config.Table),
		// Creates the row at "nothing applied" (math.MinInt64, which
		// PrepareAdvance refuses as a version) or, when it exists, changes
		// nothing; either way the row is now locked exclusively until the
		// transaction ends.
		lockSQL: `INSERT INTO ` + t + ` (consumer, entity, version) VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE version = version`,
		advanceSQL: `UPDATE ` + t + ` SET version = ? WHERE consumer = ? AND entity = ? AND version < ?`,
		lastSQL:    `SELECT version FROM ` + t + ` WHERE consumer = ? AND entity = ? AND version > ?`,
	}, nil
}

// VersionsSchemaDDL returns the statement VersionStore.Migrate runs for
// table. table must be valid (see repository.ValidateTableName).
func VersionsSchemaDDL(table string) string {
	t, _ := repository.QuoteTableName(table, "`")
	return "CREATE TABLE IF NOT EXISTS " + t + ` (
    consumer VARBINARY(255) NOT NULL,
    entity   VARBINARY(255) NOT NULL,
    version  BIGINT         NOT NULL,
    PRIMARY KEY (consumer, entity)
) ENGINE=InnoDB;
`
}

// Migrate creates the versions table if it does not exist. It is
// idempotent (CREATE TABLE IF NOT EXISTS is atomic in InnoDB's data
// dictionary).
func (s *VersionStore) Migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, strings.TrimSuffix(strings.TrimSpace(s.ddl), ";")); err != nil {
		return fmt.Errorf("mysql: migrate versions: %w", err)
	}
	return nil
}

// AdvanceTx implements repository.VersionGuard with two atomic statements
// in the caller's transaction. The first, an INSERT … ON DUPLICATE KEY
// UPDATE that changes nothing, makes sure the row exists and holds it
// exclusively locked; the second, UPDATE … SET version = new WHERE stored
// < new, applies or not. A matched row is always a changed row, so the
// affected-row count is exact whatever the DSN's clientFoundRows says
// (a single upsert could not tell "inserted" from "unchanged" under
// clientFoundRows). Only a duplicate key takes the update path: any other
// error is returned. Concurrent transactions on the same entity queue on
// the row lock. If InnoDB picks the transaction as a deadlock victim
// (error 1213, possible when a transaction that created the row rolls
// back while several wait), the error is returned: the whole transaction
// was rolled back, retry the delivery.
func (s *VersionStore) AdvanceTx(ctx context.Context, tx repository.Querier, p repository.AdvanceParams) (bool, error) {
	stored, err := repository.PrepareAdvance(p)
	if err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, s.lockSQL, stored.Consumer, stored.Entity, int64(math.MinInt64)); err != nil {
		return false, fmt.Errorf("mysql: advance version of %q: %w", p.Entity, explain(err))
	}
	res, err := tx.ExecContext(ctx, s.advanceSQL, stored.Version, stored.Consumer, stored.Entity, stored.Version)
	if err != nil {
		return false, fmt.Errorf("mysql: advance version of %q: %w", p.Entity, explain(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("mysql: advance version of %q: %w", p.Entity, err)
	}
	return n == 1, nil
}

// LastVersion returns the last applied version of (consumer, entity), or
// repository.ErrNotFound if none was applied. entity is the one given to
// AdvanceTx; it is looked up in its stored form (repository.StorageKey).
func (s *VersionStore) LastVersion(ctx context.Context, consumer, entity string) (int64, error) {
	var v int64
	err := s.db.QueryRowContext(ctx, s.lastSQL, consumer, repository.StorageKey(entity), int64(math.MinInt64)).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("mysql: last version of %q: %w", entity, repository.ErrNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("mysql: last version of %q: %w", entity, err)
	}
	return v, nil
}

var _ repository.VersionGuard = (*VersionStore)(nil)
