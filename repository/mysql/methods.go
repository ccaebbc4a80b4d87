package mysql

// The methods of the stores: each implements its contract with the
// statements of internal/sqlstore/mysql.go.

import (
	"context"
	"database/sql"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Migrate applies the table's pending migrations (see Migrations).
func (r *Repository) Migrate(ctx context.Context) error { return r.s.Migrate(ctx) }

// Migrations applies, in version order and under GET_LOCK, the migrations
// of the table not yet recorded in repository.MigrationsTable (in the
// table's schema), records each, and returns those it applied: none when
// the schema is up to date. MySQL commits DDL statement by statement: a
// statement whose effect is already there (an index created before a
// crash) counts as applied.
func (r *Repository) Migrations(ctx context.Context) ([]repository.Migration, error) {
	return r.s.Migrations(ctx)
}

// DeleteExpired implements repository.Cleaner: one READ COMMITTED
// transaction picks at most limit of the oldest rows expired before before
// with FOR UPDATE SKIP LOCKED and deletes them by primary key, 500 keys a
// statement.
func (r *Repository) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	return r.s.DeleteExpired(ctx, before, limit)
}

// Acquire implements repository.TwoPhase: one conditional INSERT in its
// own statement; when the key exists it reads the stored record (again, a
// bounded number of times, if that was released in between).
func (r *Repository) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	return r.s.Acquire(ctx, p)
}

// Reclaim implements repository.TwoPhase with one UPDATE fenced by state,
// previous owner and an expired lease; a racing reclaim that lost gets
// repository.ErrLeaseLost.
func (r *Repository) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	return r.s.Reclaim(ctx, p)
}

// Extend implements repository.TwoPhase with one UPDATE fenced by owner;
// repository.ErrLeaseLost if the lease is no longer p.Owner's.
func (r *Repository) Extend(ctx context.Context, p repository.LeaseParams) error {
	return r.s.Extend(ctx, p)
}

// Complete implements repository.TwoPhase with one fenced UPDATE that
// stores the result and marks the record completed.
func (r *Repository) Complete(ctx context.Context, p repository.CompleteParams) error {
	return r.s.Complete(ctx, p)
}

// Release implements repository.TwoPhase with one fenced DELETE.
func (r *Repository) Release(ctx context.Context, p repository.LeaseParams) error {
	return r.s.Release(ctx, p)
}

// ListStuck implements repository.Operator with one SELECT on the partial
// index of in-progress leases, without locking.
func (r *Repository) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	return r.s.ListStuck(ctx, p)
}

// Resolve implements repository.Operator with one fenced UPDATE (complete)
// or DELETE (release); repository.ErrNotFound or ErrLeaseLost when it
// matches no row.
func (r *Repository) Resolve(ctx context.Context, p repository.ResolveParams) error {
	return r.s.Resolve(ctx, p)
}

// CountRecords implements repository.Stats with one aggregate SELECT that
// reads every live record: run it at janitor intervals, not per message.
func (r *Repository) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	return r.s.CountRecords(ctx, now)
}

// Migrate applies the version table's pending migrations (see Migrations).
func (v *VersionStore) Migrate(ctx context.Context) error { return v.s.Migrate(ctx) }

// Migrations applies the version table's pending migrations, under the
// same lock and records as Repository.Migrations, and returns those it
// applied.
func (v *VersionStore) Migrations(ctx context.Context) ([]repository.Migration, error) {
	return v.s.Migrations(ctx)
}

// Advance implements repository.VersionGuard in tx: two statements lock the entity's row, then store p.Version
// if it is newer, reporting whether it did. A deadlock victim (1213) has
// had its whole transaction rolled back: retry.
func (v *VersionStore) Advance(ctx context.Context, tx *sql.Tx, p repository.AdvanceParams) (bool, error) {
	return v.s.AdvanceOn(ctx, sqlstore.StdQuerier(tx), p)
}

// LastVersion returns the last applied version of (consumer, entity), or
// repository.ErrNotFound if none was; entity is as given to Advance.
func (v *VersionStore) LastVersion(ctx context.Context, consumer, entity string) (int64, error) {
	return v.s.LastVersion(ctx, consumer, entity)
}
