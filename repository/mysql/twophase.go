package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/watermill-idempotent/internal/sqlrepo"
	"github.com/idemkit/watermill-idempotent/repository"
)

// attempts bounds how often a two-phase operation runs again when the
// record it collided with is gone before it can be read (released in
// between), or when InnoDB picked its statement as a deadlock victim.
// Each run is one atomic statement, so running it again is safe.
const attempts = 32

// twoPhaseSQL holds the statements of the two-phase contract. Every state
// change is one conditional statement fenced by state and owner, so the
// row lock taken by the statement decides races.
type twoPhaseSQL struct {
	acquire, reclaim, reread, extend, extendCheck, complete, release string
}

func newTwoPhaseSQL(t, columns string) twoPhaseSQL {
	const fenced = ` WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ?`
	return twoPhaseSQL{
		acquire: `INSERT INTO ` + t + ` (consumer, dedup_key, state, payload_hash, attempts, lease_owner, lease_until, created_at, expires_at)
VALUES (?, ?, 'in_progress', ?, 1, ?, ?, ?, ?)`,
		reclaim:     `UPDATE ` + t + ` SET lease_owner = ?, lease_until = ?, attempts = attempts + 1` + fenced + ` AND lease_until <= ?`,
		reread:      `SELECT ` + columns + ` FROM ` + t + ` WHERE consumer = ? AND dedup_key = ?`,
		extend:      `UPDATE ` + t + ` SET lease_until = ?` + fenced,
		extendCheck: `SELECT COUNT(*) FROM ` + t + fenced + ` AND lease_until = ?`,
		complete:    `UPDATE ` + t + ` SET state = 'completed', result = ?, completed_at = ?` + fenced,
		release:     `DELETE FROM ` + t + fenced,
	}
}

// Acquire implements repository.TwoPhase with one plain INSERT in its own
// statement; only error 1062 means the key exists. Then it reads the
// stored record; if that record was released between the insert and the
// read, or the insert was a deadlock victim, it tries again (a bounded
// number of times).
func (r *Repository) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if err := repository.ValidateAcquire(p); err != nil {
		return repository.Acquisition{}, err
	}
	if err := validatePayloadHash(p.PayloadHash); err != nil {
		return repository.Acquisition{}, err
	}
	now, err := datetime("Now", p.Now)
	if err != nil {
		return repository.Acquisition{}, err
	}
	lease, err := datetime("LeaseUntil", p.LeaseUntil)
	if err != nil {
		return repository.Acquisition{}, err
	}
	expires, err := datetime("ExpiresAt", p.ExpiresAt)
	if err != nil {
		return repository.Acquisition{}, err
	}
	key := repository.StorageKey(p.Key)
	for range attempts {
		_, err := r.db.ExecContext(ctx, r.tp.acquire, p.Consumer, key, p.PayloadHash, p.Owner, lease, now, expires)
		if err == nil {
			return repository.Acquisition{Acquired: true}, nil
		}
		if isDeadlock(err) {
			continue
		}
		if !isDuplicate(err) {
			return repository.Acquisition{}, fmt.Errorf("mysql: acquire: %w", err)
		}
		rec, err := scan(r.db.QueryRowContext(ctx, r.tp.reread, p.Consumer, key))
		if errors.Is(err, repository.ErrNotFound) {
			continue
		}
		if err != nil {
			return repository.Acquisition{}, fmt.Errorf("mysql: acquire: read existing: %w", err)
		}
		return repository.Acquisition{Existing: rec}, nil
	}
	return repository.Acquisition{}, fmt.Errorf("mysql: acquire: gave up after %d attempts (the record was deleted between insert and read, or deadlocks)", attempts)
}

// Reclaim implements repository.TwoPhase with one conditional UPDATE,
// fenced by state, previous owner and an expired lease, followed in the
// same transaction by a read of the row it holds locked. Racing reclaims
// queue on the row lock; after the first commits, the others re-check the
// owner, match nothing and get repository.ErrLeaseLost.
func (r *Repository) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	if err := repository.ValidateReclaim(p); err != nil {
		return repository.Record{}, err
	}
	now, err := datetime("Now", p.Now)
	if err != nil {
		return repository.Record{}, err
	}
	lease, err := datetime("LeaseUntil", p.LeaseUntil)
	if err != nil {
		return repository.Record{}, err
	}
	key := repository.StorageKey(p.Key)
	for range attempts {
		rec, err := r.reclaim(ctx, p.Consumer, key, p.PrevOwner, p.Owner, now, lease)
		if isDeadlock(err) {
			continue
		}
		if err != nil {
			return repository.Record{}, fmt.Errorf("mysql: reclaim: %w", err)
		}
		return rec, nil
	}
	return repository.Record{}, fmt.Errorf("mysql: reclaim: gave up after %d deadlocks", attempts)
}

func (r *Repository) reclaim(ctx context.Context, consumer, key, prevOwner, owner, now, lease string) (repository.Record, error) {
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return repository.Record{}, err
	}
	defer func() { _ = tx.Rollback() }()
	// The new owner always differs from the previous one
	// (ValidateReclaim), so a matched row is a changed row and RowsAffected
	// is 1 whatever the DSN's clientFoundRows says.
	res, err := tx.ExecContext(ctx, r.tp.reclaim, owner, lease, consumer, key, prevOwner, now)
	if err != nil {
		return repository.Record{}, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return repository.Record{}, err
	} else if n == 0 {
		return repository.Record{}, repository.ErrLeaseLost
	}
	rec, err := scan(tx.QueryRowContext(ctx, r.tp.reread, consumer, key))
	if err != nil {
		return repository.Record{}, err
	}
	return rec, tx.Commit()
}

// Extend implements repository.TwoPhase with one conditional UPDATE.
// Extending to the deadline already stored succeeds: MySQL reports such an
// update as changing no row, so Extend then checks that the fenced lease
// with that deadline exists.
func (r *Repository) Extend(ctx context.Context, p repository.LeaseParams) error {
	if err := repository.ValidateExtend(p); err != nil {
		return err
	}
	lease, err := datetime("LeaseUntil", p.LeaseUntil)
	if err != nil {
		return err
	}
	key := repository.StorageKey(p.Key)
	err = r.fenced(ctx, "extend", r.tp.extend, lease, p.Consumer, key, p.Owner)
	if !errors.Is(err, repository.ErrLeaseLost) {
		return err
	}
	var count int
	if err := r.db.QueryRowContext(ctx, r.tp.extendCheck, p.Consumer, key, p.Owner, lease).Scan(&count); err != nil {
		return fmt.Errorf("mysql: extend: %w", err)
	}
	if count == 0 {
		return fmt.Errorf("mysql: extend: %w", repository.ErrLeaseLost)
	}
	return nil
}

// Complete implements repository.TwoPhase with one conditional UPDATE that
// stores the result and marks the record completed.
func (r *Repository) Complete(ctx context.Context, p repository.CompleteParams) error {
	if err := repository.ValidateComplete(p); err != nil {
		return err
	}
	now, err := datetime("Now", p.Now)
	if err != nil {
		return err
	}
	return r.fenced(ctx, "complete", r.tp.complete, p.Result, now, p.Consumer, repository.StorageKey(p.Key), p.Owner)
}

// Release implements repository.TwoPhase with one conditional DELETE.
func (r *Repository) Release(ctx context.Context, p repository.LeaseParams) error {
	if err := repository.ValidateRelease(p); err != nil {
		return err
	}
	return r.fenced(ctx, "release", r.tp.release, p.Consumer, repository.StorageKey(p.Key), p.Owner)
}

// fenced runs a single-statement write guarded by state and owner (its own
// transaction, so a deadlock victim simply runs again) and reports
// repository.ErrLeaseLost when it matched no row.
func (r *Repository) fenced(ctx context.Context, op, query string, args ...any) error {
	var (
		res sql.Result
		err error
	)
	for range attempts {
		if res, err = r.db.ExecContext(ctx, query, args...); !isDeadlock(err) {
			break
		}
	}
	return sqlrepo.Fenced("mysql", op, res, err)
}

func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == erLockDeadlock
}
