package robustness

import (
	"context"
	"runtime"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// checkThenSet is the store the suite must be able to catch: its Acquire
// reads the key, then writes it in a second step — the check-then-insert
// the design forbids. Two clients that read "absent" at the same time
// both acquire. Everything else is the memory store's.
type checkThenSet struct {
	*memory.Repository
}

func newCheckThenSet() *checkThenSet { return &checkThenSet{memory.NewRepository()} }

func (s *checkThenSet) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	rec, err := s.Get(ctx, p.Consumer, p.Key)
	if err == nil && rec.ExpiresAt.After(p.Now) {
		return repository.Acquisition{Existing: rec}, nil
	}
	// The gap between the two statements, where another client runs.
	runtime.Gosched()
	// The second statement writes whatever is there now: a blind upsert,
	// here a release of the record found and a fresh claim.
	for {
		a, err := s.Repository.Acquire(ctx, p)
		if err != nil || a.Acquired || a.Existing.State != repository.StateInProgress {
			return a, err
		}
		_ = s.Release(ctx, repository.LeaseParams{Consumer: p.Consumer, Key: p.Key, Owner: a.Existing.LeaseOwner})
	}
}
