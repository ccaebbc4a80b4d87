package postgres

// The methods of the stores: each implements its contract with the
// statements of internal/sqlstore/postgres.go.

import (
	"context"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// Migrate applies the table's pending migrations (see Migrations).
func (r *Repository) Migrate(ctx context.Context) error { return r.s.Migrate(ctx) }

// Migrations applies, in version order and under an advisory lock, the
// migrations of the table not yet recorded in repository.MigrationsTable
// (in the table's schema), records each, and returns those it applied:
// none when the schema is up to date. All of it commits in one transaction
// or none does.
func (r *Repository) Migrations(ctx context.Context) ([]repository.Migration, error) {
	return r.s.Migrations(ctx)
}

// ClaimTx implements repository.Transactional with one INSERT … ON
// CONFLICT DO NOTHING in the caller's transaction. On a duplicate it reads
// the stored record in the same transaction; a concurrent claim of the key
// waits on the first one's row lock.
func (r *Repository) ClaimTx(ctx context.Context, tx repository.Querier, p repository.ClaimParams) (repository.Claim, error) {
	return r.s.ClaimTx(ctx, tx, p)
}

// SaveResultTx implements repository.Transactional with one UPDATE in the
// caller's transaction; repository.ErrNotFound if there is no such record.
func (r *Repository) SaveResultTx(ctx context.Context, tx repository.Querier, p repository.SaveResultParams) error {
	return r.s.SaveResultTx(ctx, tx, p)
}

// ClaimBatchTx implements repository.BatchTransactional (group commit):
// one INSERT … ON CONFLICT DO NOTHING RETURNING of every key, then one
// read per duplicate, the keys in one lock order, so batches sharing keys
// wait for each other instead of deadlocking.
func (r *Repository) ClaimBatchTx(ctx context.Context, tx repository.Querier, params []repository.ClaimParams) ([]repository.Claim, error) {
	return r.s.ClaimBatchTx(ctx, tx, params)
}

// RetryableTx implements repository.BatchTransactional: err is a deadlock
// victim (SQLSTATE 40P01) or a serialization failure (40001): roll back,
// and the whole transaction runs again.
func (r *Repository) RetryableTx(err error) bool { return r.s.RetryableTx(err) }

// Get implements repository.Reader; repository.ErrNotFound if there is no
// record.
func (r *Repository) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	return r.s.Get(ctx, consumer, key)
}

// DeleteExpired implements repository.Cleaner: one statement deletes at
// most limit of the oldest rows expired before before, by primary key,
// skipping rows that claims hold locked.
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

// ClaimOn is ClaimTx in any driver's transaction, such as a pgx.Tx through
// pgxexec.Exec (middleware/pgxinbox uses it).
func (r *Repository) ClaimOn(ctx context.Context, ex sqlexec.Executor, p repository.ClaimParams) (repository.Claim, error) {
	return r.s.ClaimOn(ctx, ex, p)
}

// ClaimBatchOn is ClaimBatchTx in any driver's transaction.
func (r *Repository) ClaimBatchOn(ctx context.Context, ex sqlexec.Executor, params []repository.ClaimParams) ([]repository.Claim, error) {
	return r.s.ClaimBatchOn(ctx, ex, params)
}

// SaveResultOn is SaveResultTx in any driver's transaction.
func (r *Repository) SaveResultOn(ctx context.Context, ex sqlexec.Executor, p repository.SaveResultParams) error {
	return r.s.SaveResultOn(ctx, ex, p)
}

// GetOn is Get on any driver's connection or transaction.
func (r *Repository) GetOn(ctx context.Context, ex sqlexec.Executor, consumer, key string) (repository.Record, error) {
	return r.s.GetOn(ctx, ex, consumer, key)
}

// ClaimStatement returns the claim of every key of params as one plain
// multi-row INSERT, without the conflict clause, in the lock order of
// ClaimBatchOn, with its bound arguments, for a driver to send in the
// round trip of BEGIN (middleware/pgxinbox queues it in a pgx.Batch after
// Batch.BeginTx). A key already taken fails it with a unique violation,
// after waiting for a transaction that holds the key, and aborts the
// transaction: roll back, then claim with ClaimOn or ClaimBatchOn, which
// tell the taken keys apart. 1 to 1,000 keys.
func (r *Repository) ClaimStatement(params []repository.ClaimParams) (query string, args []any, err error) {
	return r.s.ClaimStatement(params)
}

// Migrate applies the version table's pending migrations (see Migrations).
func (v *VersionStore) Migrate(ctx context.Context) error { return v.s.Migrate(ctx) }

// Migrations applies the version table's pending migrations, under the
// same lock and records as Repository.Migrations, and returns those it
// applied.
func (v *VersionStore) Migrations(ctx context.Context) ([]repository.Migration, error) {
	return v.s.Migrations(ctx)
}

// AdvanceTx implements repository.VersionGuard in the caller's
// transaction: one conditional upsert stores p.Version if it is newer than
// the stored one and reports whether it did. A concurrent transaction on
// the entity waits for the row lock (READ COMMITTED) or fails with
// SQLSTATE 40001 (REPEATABLE READ, SERIALIZABLE): retry.
func (v *VersionStore) AdvanceTx(ctx context.Context, tx repository.Querier, p repository.AdvanceParams) (bool, error) {
	return v.s.AdvanceTx(ctx, tx, p)
}

// LastVersion returns the last applied version of (consumer, entity), or
// repository.ErrNotFound if none was; entity is as given to AdvanceTx.
func (v *VersionStore) LastVersion(ctx context.Context, consumer, entity string) (int64, error) {
	return v.s.LastVersion(ctx, consumer, entity)
}

// AdvanceOn is AdvanceTx in any driver's transaction, such as a pgx.Tx
// through pgxexec.Exec (pgxinbox.ApplyIfNewer uses it).
func (v *VersionStore) AdvanceOn(ctx context.Context, ex sqlexec.Executor, p repository.AdvanceParams) (bool, error) {
	return v.s.AdvanceOn(ctx, ex, p)
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

// ClaimTx implements repository.Transactional with the key's advisory
// lock, then an INSERT unless a partition holds the key (READ COMMITTED
// only: other levels get repository.ErrInvalidParams) in the caller's
// transaction. On a duplicate it reads the stored record in the same
// transaction; a concurrent claim of the key waits on the first one's row
// lock.
func (r *PartitionedRepository) ClaimTx(ctx context.Context, tx repository.Querier, p repository.ClaimParams) (repository.Claim, error) {
	return r.s.ClaimTx(ctx, tx, p)
}

// ClaimOn is ClaimTx in any driver's transaction, such as a pgx.Tx through
// pgxexec.Exec.
func (r *PartitionedRepository) ClaimOn(ctx context.Context, ex sqlexec.Executor, p repository.ClaimParams) (repository.Claim, error) {
	return r.s.ClaimOn(ctx, ex, p)
}

// SaveResultTx implements repository.Transactional with one UPDATE in the
// caller's transaction; repository.ErrNotFound if there is no such record.
func (r *PartitionedRepository) SaveResultTx(ctx context.Context, tx repository.Querier, p repository.SaveResultParams) error {
	return r.s.SaveResultTx(ctx, tx, p)
}

// ClaimBatchTx implements repository.BatchTransactional (group commit):
// ClaimTx for every key, the advisory locks taken in one global order, so
// batches sharing keys cannot deadlock.
func (r *PartitionedRepository) ClaimBatchTx(ctx context.Context, tx repository.Querier, params []repository.ClaimParams) ([]repository.Claim, error) {
	return r.s.ClaimBatchTx(ctx, tx, params)
}

// RetryableTx implements repository.BatchTransactional: err is a deadlock
// victim (SQLSTATE 40P01) or a serialization failure (40001): roll back,
// and the whole transaction runs again.
func (r *PartitionedRepository) RetryableTx(err error) bool { return r.s.RetryableTx(err) }

// Get implements repository.Reader; repository.ErrNotFound if there is no
// record.
func (r *PartitionedRepository) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	return r.s.Get(ctx, consumer, key)
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
