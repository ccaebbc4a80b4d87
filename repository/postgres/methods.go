package postgres

// The methods of the stores: each implements its contract with the
// statements of internal/sqlstore/postgres.go.

import (
	"context"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Migrate applies the table's pending migrations (see Migrations).
func (r *Repository[TTx]) Migrate(ctx context.Context) error { return r.s.Migrate(ctx) }

// Migrations applies, in version order and under an advisory lock, the
// migrations of the table not yet recorded in repository.MigrationsTable
// (in the table's schema), records each, and returns those it applied:
// none when the schema is up to date. All of it commits in one transaction
// or none does.
func (r *Repository[TTx]) Migrations(ctx context.Context) ([]repository.Migration, error) {
	return r.s.Migrations(ctx)
}

// DeleteExpired implements repository.Cleaner: one statement deletes at
// most limit of the oldest rows expired before before, by primary key,
// skipping rows that claims hold locked.
func (r *Repository[TTx]) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	return r.s.DeleteExpired(ctx, before, limit)
}

// Acquire implements repository.TwoPhase: one conditional INSERT in its
// own statement; when the key exists it reads the stored record (again, a
// bounded number of times, if that was released in between).
func (r *Repository[TTx]) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	return r.s.Acquire(ctx, p)
}

// Reclaim implements repository.TwoPhase with one UPDATE fenced by state,
// previous owner and an expired lease; a racing reclaim that lost gets
// repository.ErrLeaseLost.
func (r *Repository[TTx]) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	return r.s.Reclaim(ctx, p)
}

// Extend implements repository.TwoPhase with one UPDATE fenced by owner;
// repository.ErrLeaseLost if the lease is no longer p.Owner's.
func (r *Repository[TTx]) Extend(ctx context.Context, p repository.LeaseParams) error {
	return r.s.Extend(ctx, p)
}

// Complete implements repository.TwoPhase with one fenced UPDATE that
// stores the result and marks the record completed.
func (r *Repository[TTx]) Complete(ctx context.Context, p repository.CompleteParams) error {
	return r.s.Complete(ctx, p)
}

// Release implements repository.TwoPhase with one fenced DELETE.
func (r *Repository[TTx]) Release(ctx context.Context, p repository.LeaseParams) error {
	return r.s.Release(ctx, p)
}

// ListStuck implements repository.Operator with one SELECT on the partial
// index of in-progress leases, without locking.
func (r *Repository[TTx]) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	return r.s.ListStuck(ctx, p)
}

// Resolve implements repository.Operator with one fenced UPDATE (complete)
// or DELETE (release); repository.ErrNotFound or ErrLeaseLost when it
// matches no row.
func (r *Repository[TTx]) Resolve(ctx context.Context, p repository.ResolveParams) error {
	return r.s.Resolve(ctx, p)
}

// CountRecords implements repository.Stats with one aggregate SELECT that
// reads every live record: run it at janitor intervals, not per message.
func (r *Repository[TTx]) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	return r.s.CountRecords(ctx, now)
}

// Migrate applies the version table's pending migrations (see Migrations).
func (v *VersionStore[TTx]) Migrate(ctx context.Context) error { return v.s.Migrate(ctx) }

// Migrations applies the version table's pending migrations, under the
// same lock and records as Repository.Migrations, and returns those it
// applied.
func (v *VersionStore[TTx]) Migrations(ctx context.Context) ([]repository.Migration, error) {
	return v.s.Migrations(ctx)
}

// Advance implements repository.VersionGuard in tx: one conditional upsert stores p.Version if it is newer than
// the stored one and reports whether it did. A concurrent transaction on
// the entity waits for the row lock (READ COMMITTED) or fails with
// SQLSTATE 40001 (REPEATABLE READ, SERIALIZABLE): retry.
func (v *VersionStore[TTx]) Advance(ctx context.Context, tx TTx, p repository.AdvanceParams) (bool, error) {
	return v.s.AdvanceOn(ctx, v.txs.Exec(tx), p)
}

// LastVersion returns the last applied version of (consumer, entity), or
// repository.ErrNotFound if none was; entity is as given to Advance.
func (v *VersionStore[TTx]) LastVersion(ctx context.Context, consumer, entity string) (int64, error) {
	return v.s.LastVersion(ctx, consumer, entity)
}

// Migrate applies the table's pending migrations (see Migrations).
func (r *PartitionedRepository) Migrate(ctx context.Context) error { return r.s.Migrate(ctx) }

// Migrations applies, in version order and under an advisory lock, the
// migrations of the table not yet recorded in repository.MigrationsTable
// (in the table's schema), records each, and returns those it applied:
// none when the schema is up to date. Its line is
// migrations/partitioned_inbox; Migrate also creates the partitions from
// now to now+Ahead.
func (r *PartitionedRepository) Migrations(ctx context.Context) ([]repository.Migration, error) {
	return r.s.Migrations(ctx)
}

// DeleteExpired implements repository.Cleaner: it detaches and drops every
// partition whose whole range lies before before, whatever limit says, and
// returns how many records those held.
func (r *PartitionedRepository) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	return r.s.DeleteExpired(ctx, before, limit)
}

// Acquire implements repository.TwoPhase: in one short READ COMMITTED
// transaction it takes the key's advisory lock, inserts the in-progress
// record unless a partition holds the key, and otherwise reads it.
func (r *PartitionedRepository) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	return r.s.Acquire(ctx, p)
}

// Reclaim implements repository.TwoPhase with one UPDATE fenced by state,
// previous owner and an expired lease; a racing reclaim that lost gets
// repository.ErrLeaseLost.
func (r *PartitionedRepository) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	return r.s.Reclaim(ctx, p)
}

// Extend implements repository.TwoPhase with one UPDATE fenced by owner;
// repository.ErrLeaseLost if the lease is no longer p.Owner's.
func (r *PartitionedRepository) Extend(ctx context.Context, p repository.LeaseParams) error {
	return r.s.Extend(ctx, p)
}

// Complete implements repository.TwoPhase with one fenced UPDATE that
// stores the result and marks the record completed.
func (r *PartitionedRepository) Complete(ctx context.Context, p repository.CompleteParams) error {
	return r.s.Complete(ctx, p)
}

// Release implements repository.TwoPhase with one fenced DELETE.
func (r *PartitionedRepository) Release(ctx context.Context, p repository.LeaseParams) error {
	return r.s.Release(ctx, p)
}

// ListStuck implements repository.Operator with one SELECT on the partial
// index of in-progress leases, without locking.
func (r *PartitionedRepository) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	return r.s.ListStuck(ctx, p)
}

// Resolve implements repository.Operator with one fenced UPDATE (complete)
// or DELETE (release); repository.ErrNotFound or ErrLeaseLost when it
// matches no row.
func (r *PartitionedRepository) Resolve(ctx context.Context, p repository.ResolveParams) error {
	return r.s.Resolve(ctx, p)
}

// CountRecords implements repository.Stats with one aggregate SELECT that
// reads every live record: run it at janitor intervals, not per message.
func (r *PartitionedRepository) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	return r.s.CountRecords(ctx, now)
}
