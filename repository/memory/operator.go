package memory

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// ListStuck implements repository.Operator. It walks every record under
// the mutex, so it holds up other calls for the length of the walk.
func (r *Repository) ListStuck(_ context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	p, err := storekit.ValidateListStuck(p)
	if err != nil {
		return nil, err
	}
	now := at(p.Now)
	r.mu.Lock()
	var recs []repository.Record
	for id, rec := range r.records {
		if (p.Consumer == "" || id.consumer == p.Consumer) && stuck(rec, now) {
			recs = append(recs, clone(rec))
		}
	}
	r.mu.Unlock()
	return storekit.OrderStuck(recs, p.Limit), nil
}

// Resolve implements repository.Operator atomically under the mutex.
func (r *Repository) Resolve(_ context.Context, p repository.ResolveParams) error {
	if err := storekit.ValidateResolve(p); err != nil {
		return err
	}
	now := at(p.Now)
	id := recordID{p.Consumer, p.Key} // p.Key is already the stored key
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.records[id]
	if !ok || !rec.ExpiresAt.After(now) {
		return fmt.Errorf("memory: resolve (%s) %q/%q: %w", p.Action, p.Consumer, p.Key, repository.ErrNotFound)
	}
	if !stuck(rec, now) || rec.LeaseOwner != p.ExpectedOwner {
		return fmt.Errorf("memory: resolve (%s) %q/%q: the record is no longer in progress under an expired lease of %q: %w",
			p.Action, p.Consumer, p.Key, p.ExpectedOwner, repository.ErrLeaseLost)
	}
	switch p.Action {
	case repository.ResolveComplete:
		rec.State = repository.StateCompleted
		rec.Result = bytes.Clone(p.Result)
		rec.CompletedAt = now
	default:
		delete(r.records, id)
	}
	return nil
}

// stuck reports whether rec is in progress under a lease expired at now
// and not expired itself.
func stuck(rec *repository.Record, now time.Time) bool {
	return rec.State == repository.StateInProgress && !rec.LeaseUntil.After(now) && rec.ExpiresAt.After(now)
}

var _ repository.Operator = (*Repository)(nil)
