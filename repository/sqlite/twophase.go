package sqlite

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/watermill-idempotent/internal/sqlrepo"
	"github.com/idemkit/watermill-idempotent/repository"
)

// acquireAttempts bounds how often Acquire retries when the record it
// collided with is gone before it can be read (released in between).
const acquireAttempts = 32

// twoPhaseSQL holds the statements of the two-phase contract. Every state
// change is one conditional statement fenced by state and owner; SQLite's
// single writer lock serializes them, so races are decided by whichever
// statement runs first. Placeholders are numbered (?N) so the arguments
// read like PostgreSQL's.
type twoPhaseSQL struct {
	acquire, reclaim, extend, complete, release string
}

func newTwoPhaseSQL(t string) twoPhaseSQL {
	const fenced = ` WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3`
	return twoPhaseSQL{
		acquire: `INSERT INTO ` + t + ` (consumer, dedup_key, state, payload_hash, attempts, lease_owner, lease_until, created_at, expires_at)
VALUES (?1, ?2, 'in_progress', ?3, 1, ?4, ?5, ?6, ?7)
ON CONFLICT (consumer, dedup_key) DO NOTHING`,
		reclaim: `UPDATE ` + t + ` SET lease_owner = ?4, lease_until = ?6, attempts = attempts + 1` + fenced + ` AND lease_until <= ?5
RETURNING consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at`,
		extend:   `UPDATE ` + t + ` SET lease_until = ?4` + fenced,
		complete: `UPDATE ` + t + ` SET state = 'completed', result = ?4, completed_at = ?5` + fenced,
		release:  `DELETE FROM ` + t + fenced,
	}
}

// Acquire implements repository.TwoPhase with one
// INSERT … ON CONFLICT DO NOTHING in its own statement. When the key
// exists it reads the stored record; if that record was released between
// the insert and the read, it tries again (a bounded number of times).
func (r *Repository) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if err := repository.ValidateAcquire(p); err != nil {
		return repository.Acquisition{}, err
	}
	key := repository.StorageKey(p.Key)
	for range acquireAttempts {
		res, err := r.db.ExecContext(ctx, r.tp.acquire, p.Consumer, key, p.PayloadHash, p.Owner,
			micros(p.LeaseUntil), micros(p.Now), micros(p.ExpiresAt))
		if err != nil {
			return repository.Acquisition{}, fmt.Errorf("sqlite: acquire: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return repository.Acquisition{}, fmt.Errorf("sqlite: acquire: %w", err)
		}
		if n == 1 {
			return repository.Acquisition{Acquired: true}, nil
		}
		rec, err := scan(r.db.QueryRowContext(ctx, r.selectSQL, p.Consumer, key))
		if errors.Is(err, repository.ErrNotFound) {
			continue
		}
		if err != nil {
			return repository.Acquisition{}, fmt.Errorf("sqlite: acquire: read existing: %w", err)
		}
		return repository.Acquisition{Existing: rec}, nil
	}
	return repository.Acquisition{}, fmt.Errorf("sqlite: acquire: the record was deleted between insert and read %d times in a row", acquireAttempts)
}

// Reclaim implements repository.TwoPhase with one conditional UPDATE …
// RETURNING. SQLite runs one writer at a time, so racing reclaims queue
// on the database lock; after the first, the others match nothing and get
// repository.ErrLeaseLost.
func (r *Repository) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	if err := repository.ValidateReclaim(p); err != nil {
		return repository.Record{}, err
	}
	rec, err := scan(r.db.QueryRowContext(ctx, r.tp.reclaim, p.Consumer, repository.StorageKey(p.Key),
		p.PrevOwner, p.Owner, micros(p.Now), micros(p.LeaseUntil)))
	if errors.Is(err, repository.ErrNotFound) {
		return repository.Record{}, fmt.Errorf("sqlite: reclaim: %w", repository.ErrLeaseLost)
	}
	if err != nil {
		return repository.Record{}, fmt.Errorf("sqlite: reclaim: %w", err)
	}
	return rec, nil
}

// Extend implements repository.TwoPhase with one conditional UPDATE.
func (r *Repository) Extend(ctx context.Context, p repository.LeaseParams) error {
	if err := repository.ValidateExtend(p); err != nil {
		return err
	}
	return r.fenced(ctx, "extend", r.tp.extend, p.Consumer, repository.StorageKey(p.Key), p.Owner, micros(p.LeaseUntil))
}

// Complete implements repository.TwoPhase with one conditional UPDATE.
func (r *Repository) Complete(ctx context.Context, p repository.CompleteParams) error {
	if err := repository.ValidateComplete(p); err != nil {
		return err
	}
	return r.fenced(ctx, "complete", r.tp.complete, p.Consumer, repository.StorageKey(p.Key), p.Owner, p.Result, micros(p.Now))
}

// Release implements repository.TwoPhase with one conditional DELETE.
func (r *Repository) Release(ctx context.Context, p repository.LeaseParams) error {
	if err := repository.ValidateRelease(p); err != nil {
		return err
	}
	return r.fenced(ctx, "release", r.tp.release, p.Consumer, repository.StorageKey(p.Key), p.Owner)
}

// fenced runs a statement guarded by state and owner and reports
// repository.ErrLeaseLost when it matched no row.
func (r *Repository) fenced(ctx context.Context, op, query string, args ...any) error {
	res, err := r.db.ExecContext(ctx, query, args...)
	return sqlrepo.Fenced("sqlite", op, res, err)
}
