package sqlstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Acquire implements repository.TwoPhase with one conditional insert in
// its own statement. When the key exists it reads the stored record; if
// that was released between insert and read, or the insert was a
// deadlock victim, it tries again (a bounded number of times).
func (s *Inbox) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if err := storekit.ValidateAcquire(p); err != nil {
		return repository.Acquisition{}, err
	}
	args, err := s.args(p.PayloadHash, p.Consumer, repository.StorageKey(p.Key), p.PayloadHash, p.Owner, p.LeaseUntil, p.Now, p.ExpiresAt)
	if err != nil {
		return repository.Acquisition{}, err
	}
	for range attempts {
		acquired, rec, err := s.insert(ctx, s.db, s.q.acquire, s.q.get, args)
		switch {
		case s.again(err):
			continue
		case err != nil:
			return repository.Acquisition{}, s.wrap("acquire", err)
		}
		return repository.Acquisition{Acquired: acquired, Existing: rec}, nil
	}
	return repository.Acquisition{}, fmt.Errorf("%s: acquire: gave up after %d attempts (the record was deleted between insert and read, or deadlocks)", s.d.Name, attempts)
}

// Reclaim implements repository.TwoPhase with one UPDATE fenced by state,
// previous owner and an expired lease, that returns the row (RETURNING, or
// a read in the same transaction). Racing reclaims queue on the row lock;
// after the first commits, the others match nothing and get
// repository.ErrLeaseLost.
func (s *Inbox) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	if err := storekit.ValidateReclaim(p); err != nil {
		return repository.Record{}, err
	}
	args, err := s.args(nil, p.Consumer, repository.StorageKey(p.Key), p.PrevOwner, p.Owner, p.Now, p.LeaseUntil)
	if err != nil {
		return repository.Record{}, err
	}
	var rec repository.Record
	err = s.retry(func() error {
		if s.d.Returning {
			rec, err = s.get(ctx, s.db, s.q.reclaim, args...)
			return err
		}
		return s.db.InTx(ctx, false, func(tx Executor) error {
			// The new owner differs from the previous one (ValidateReclaim),
			// so a matched row is a changed row.
			n, err := s.q.reclaim.exec(ctx, tx, args...)
			if err != nil || n == 0 {
				return cmp.Or(err, repository.ErrNotFound)
			}
			rec, err = s.get(ctx, tx, s.q.get, args[0], args[1])
			return err
		})
	})
	if errors.Is(err, repository.ErrNotFound) {
		err = repository.ErrLeaseLost
	}
	return rec, s.wrap("reclaim", err)
}

// Extend implements repository.TwoPhase with one fenced UPDATE. Extending
// to the deadline already stored succeeds, also where that reports no
// changed row (MySQL): the fenced lease is then checked to exist.
func (s *Inbox) Extend(ctx context.Context, p repository.LeaseParams) error {
	if err := storekit.ValidateExtend(p); err != nil {
		return err
	}
	args, err := s.args(nil, p.Consumer, repository.StorageKey(p.Key), p.Owner, p.LeaseUntil)
	if err != nil {
		return err
	}
	err = s.fenced(ctx, "extend", s.q.extend, args...)
	if errors.Is(err, repository.ErrLeaseLost) && s.d.ChangedRows {
		if n, cerr := s.count(ctx, s.db, s.q.extendCheck, args...); cerr != nil || n == 1 {
			return s.wrap("extend", cerr)
		}
	}
	return err
}

// Complete implements repository.TwoPhase with one fenced UPDATE that
// stores the result and marks the record completed.
func (s *Inbox) Complete(ctx context.Context, p repository.CompleteParams) error {
	if err := storekit.ValidateComplete(p); err != nil {
		return err
	}
	args, err := s.args(nil, p.Consumer, repository.StorageKey(p.Key), p.Owner, p.Result, p.Now)
	if err != nil {
		return err
	}
	return s.fenced(ctx, "complete", s.q.complete, args...)
}

// Release implements repository.TwoPhase with one fenced DELETE.
func (s *Inbox) Release(ctx context.Context, p repository.LeaseParams) error {
	if err := storekit.ValidateRelease(p); err != nil {
		return err
	}
	return s.fenced(ctx, "release", s.q.release, p.Consumer, repository.StorageKey(p.Key), p.Owner)
}

// fenced runs a write guarded by state and owner, reporting
// repository.ErrLeaseLost when it matched no row.
func (s *Inbox) fenced(ctx context.Context, op string, st Stmt, args ...any) error {
	n, err := s.write(ctx, st, args...)
	if err == nil && n == 0 {
		err = repository.ErrLeaseLost
	}
	return s.wrap(op, err)
}

// ListStuck implements repository.Operator with one SELECT that reads
// without locking on the partial index of in-progress leases (migration
// 2), so its cost grows with the in-progress records, not the table.
func (s *Inbox) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	p, err := storekit.ValidateListStuck(p)
	if err != nil {
		return nil, err
	}
	args, err := s.args(nil, p.Now, p.Consumer, p.Limit)
	if err != nil {
		return nil, err
	}
	recs, err := collect(ctx, s.db, s.q.list, s.scan, args...)
	return recs, s.wrap("list stuck", err)
}

// Resolve implements repository.Operator with one UPDATE (complete) or
// DELETE (release) fenced by state, owner, expired lease and record
// expiry; the UPDATE always changes the state, so its count is exact on
// every dialect. When it matches no row, a second read tells
// repository.ErrNotFound from repository.ErrLeaseLost.
func (s *Inbox) Resolve(ctx context.Context, p repository.ResolveParams) error {
	if err := storekit.ValidateResolve(p); err != nil {
		return err
	}
	args, err := s.args(nil, p.Consumer, p.Key, p.ExpectedOwner, p.Now, p.Result)
	if err != nil {
		return err
	}
	st := s.q.resolveRelease
	if p.Action == repository.ResolveComplete {
		st = s.q.resolveComplete
	}
	n, err := s.write(ctx, st, args...)
	if err == nil && n == 0 {
		if n, err = s.count(ctx, s.db, s.q.live, args[0], args[1], args[3]); err == nil && n == 0 {
			return fmt.Errorf("%s: resolve (%s) %q/%q: %w", s.d.Name, p.Action, p.Consumer, p.Key, repository.ErrNotFound)
		}
		if err == nil {
			return fmt.Errorf("%s: resolve (%s) %q/%q: the record is no longer in progress under an expired lease of %q: %w",
				s.d.Name, p.Action, p.Consumer, p.Key, p.ExpectedOwner, repository.ErrLeaseLost)
		}
	}
	return s.wrap(fmt.Sprintf("resolve (%s)", p.Action), err)
}

// CountRecords implements repository.Stats with one aggregate SELECT, a
// snapshot that takes no row locks; it reads every live record, so run it
// at janitor intervals, not per message.
func (s *Inbox) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	if err := storekit.ValidateCountRecords(now); err != nil {
		return nil, err
	}
	args, err := s.args(nil, now)
	if err != nil {
		return nil, err
	}
	counts, err := collect(ctx, s.db, s.q.count, func(r Row) (c repository.RecordCount, err error) {
		err = r.Scan(&c.Consumer, &c.InProgress, &c.Stale, &c.Completed)
		return
	}, args...)
	return counts, s.wrap("count records", err)
}
