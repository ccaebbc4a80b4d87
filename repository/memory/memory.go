package memory

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

type recordID struct{ consumer, key string }

// Repository keeps inbox records in memory. It implements
// repository.TwoPhase, repository.Reader and repository.Cleaner and is
// safe for concurrent use. Each method is atomic: it runs entirely under
// one mutex. Times are kept to the microsecond, like the SQL backends.
//
// A record whose ExpiresAt is not after an Acquire's Now is treated as
// absent by that Acquire (it is replaced) and cannot be reclaimed, as on
// Redis where the TTL has already removed it; Get returns it until
// DeleteExpired removes it.
//
// The zero value is not usable; call NewRepository.
type Repository struct {
	mu      sync.Mutex
	records map[recordID]*repository.Record
}

// NewRepository returns an empty Repository.
func NewRepository() *Repository {
	return &Repository{records: make(map[recordID]*repository.Record)}
}

func at(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// clone returns a copy of rec that shares no memory with it.
func clone(rec *repository.Record) repository.Record {
	c := *rec
	c.PayloadHash = bytes.Clone(rec.PayloadHash)
	c.Result = bytes.Clone(rec.Result)
	return c
}

// Acquire implements repository.TwoPhase. It creates the in_progress
// record unless a live one exists, which it returns.
func (r *Repository) Acquire(_ context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if err := storekit.ValidateAcquire(p); err != nil {
		return repository.Acquisition{}, err
	}
	id := recordID{p.Consumer, repository.StorageKey(p.Key)}
	now := at(p.Now)

	r.mu.Lock()
	defer r.mu.Unlock()
	if rec, ok := r.records[id]; ok && rec.ExpiresAt.After(now) {
		return repository.Acquisition{Existing: clone(rec)}, nil
	}
	r.records[id] = &repository.Record{
		Consumer:    id.consumer,
		Key:         id.key,
		State:       repository.StateInProgress,
		PayloadHash: bytes.Clone(p.PayloadHash),
		Attempts:    1,
		LeaseOwner:  p.Owner,
		LeaseUntil:  at(p.LeaseUntil),
		CreatedAt:   now,
		ExpiresAt:   at(p.ExpiresAt),
	}
	return repository.Acquisition{Acquired: true}, nil
}

// Reclaim implements repository.TwoPhase.
func (r *Repository) Reclaim(_ context.Context, p repository.ReclaimParams) (repository.Record, error) {
	if err := storekit.ValidateReclaim(p); err != nil {
		return repository.Record{}, err
	}
	now := at(p.Now)

	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.owned(p.Consumer, p.Key, p.PrevOwner)
	if rec == nil || rec.LeaseUntil.After(now) || !rec.ExpiresAt.After(now) {
		return repository.Record{}, fmt.Errorf("memory: reclaim: %w", repository.ErrLeaseLost)
	}
	rec.LeaseOwner = p.Owner
	rec.LeaseUntil = at(p.LeaseUntil)
	rec.Attempts++
	return clone(rec), nil
}

// Extend implements repository.TwoPhase.
func (r *Repository) Extend(_ context.Context, p repository.LeaseParams) error {
	if err := storekit.ValidateExtend(p); err != nil {
		return err
	}
	return r.updateOwned("extend", p.Consumer, p.Key, p.Owner, func(rec *repository.Record) {
		rec.LeaseUntil = at(p.LeaseUntil)
	})
}

// Complete implements repository.TwoPhase.
func (r *Repository) Complete(_ context.Context, p repository.CompleteParams) error {
	if err := storekit.ValidateComplete(p); err != nil {
		return err
	}
	return r.updateOwned("complete", p.Consumer, p.Key, p.Owner, func(rec *repository.Record) {
		rec.State = repository.StateCompleted
		rec.Result = bytes.Clone(p.Result)
		rec.CompletedAt = at(p.Now)
	})
}

// Release implements repository.TwoPhase.
func (r *Repository) Release(_ context.Context, p repository.LeaseParams) error {
	if err := storekit.ValidateRelease(p); err != nil {
		return err
	}
	return r.updateOwned("release", p.Consumer, p.Key, p.Owner, func(rec *repository.Record) {
		delete(r.records, recordID{rec.Consumer, rec.Key})
	})
}

// updateOwned runs change on the in_progress record of (consumer, key)
// held by owner, under r.mu, or returns ErrLeaseLost for op when owner
// holds no such record: the fencing every lease operation shares.
func (r *Repository) updateOwned(op, consumer, key, owner string, change func(rec *repository.Record)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.owned(consumer, key, owner)
	if rec == nil {
		return fmt.Errorf("memory: %s: %w", op, repository.ErrLeaseLost)
	}
	change(rec)
	return nil
}

// owned returns the in_progress record of (consumer, key) held by owner,
// or nil. r.mu must be held.
func (r *Repository) owned(consumer, key, owner string) *repository.Record {
	rec, ok := r.records[recordID{consumer, repository.StorageKey(key)}]
	if !ok || rec.State != repository.StateInProgress || rec.LeaseOwner != owner {
		return nil
	}
	return rec
}

// Get implements repository.Reader. The returned record is a copy.
func (r *Repository) Get(_ context.Context, consumer, key string) (repository.Record, error) {
	if err := storekit.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.records[recordID{consumer, repository.StorageKey(key)}]
	if !ok {
		return repository.Record{}, fmt.Errorf("memory: get: %w", repository.ErrNotFound)
	}
	return clone(rec), nil
}

// DeleteExpired implements repository.Cleaner: it deletes at most limit
// records whose ExpiresAt is before the given time, earliest first.
func (r *Repository) DeleteExpired(_ context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("memory: delete expired: %w: limit must be positive", repository.ErrInvalidParams)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var expired []recordID
	for id, rec := range r.records {
		if rec.ExpiresAt.Before(before) {
			expired = append(expired, id)
		}
	}
	slices.SortFunc(expired, func(a, b recordID) int {
		return r.records[a].ExpiresAt.Compare(r.records[b].ExpiresAt)
	})
	if len(expired) > limit {
		expired = expired[:limit]
	}
	for _, id := range expired {
		delete(r.records, id)
	}
	return len(expired), nil
}

var _ interface {
	repository.TwoPhase
	repository.Reader
	repository.Cleaner
} = (*Repository)(nil)
