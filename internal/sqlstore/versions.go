package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Versions keeps the last applied version per (consumer, entity). It
// implements repository.VersionGuard and is safe for concurrent use. Rows
// never expire (an old version could apply again): delete one when the
// entity itself is deleted.
type Versions struct {
	migrator
	advance []Stmt
	last    Stmt
}

// NewVersions returns the version store of dialect d over db. It does not
// create the table: call Migrate, or apply the dialect's migration files.
func NewVersions(d *Dialect, db DB, config Config) (*Versions, error) {
	m, err := d.line("versions", repository.DefaultVersionsTableName).migrator(db, config.Table)
	if err != nil {
		return nil, err
	}
	s := &Versions{migrator: m}
	for _, q := range d.Versions.Advance {
		s.advance = append(s.advance, d.Bound(m.t.quoted, q))
	}
	s.last = d.Bound(m.t.quoted, d.Versions.Last)
	return s, nil
}

// AdvanceOn implements repository.VersionGuard's Advance in the transaction ex
// runs in, on any driver.
func (s *Versions) AdvanceOn(ctx context.Context, ex Executor, p repository.AdvanceParams) (bool, error) {
	stored, err := storekit.PrepareAdvance(p)
	if err != nil {
		return false, err
	}
	var n int64
	for _, st := range s.advance {
		if n, err = st.exec(ctx, ex, stored.Consumer, stored.Entity, stored.Version); err != nil {
			return false, s.wrap(fmt.Sprintf("advance version of %q", p.Entity), err)
		}
	}
	return n == 1, nil
}

// LastVersion returns the last applied version of (consumer, entity), or
// repository.ErrNotFound if none was; entity is as given to Advance.
func (s *Versions) LastVersion(ctx context.Context, consumer, entity string) (int64, error) {
	var v int64
	err := s.last.row(ctx, s.db, consumer, repository.StorageKey(entity)).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		err = repository.ErrNotFound
	}
	return v, s.wrap(fmt.Sprintf("last version of %q", entity), err)
}
