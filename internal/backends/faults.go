package backends

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// ErrConnReset is what Faulty's failed calls return: a connection
// dropped under the call.
var ErrConnReset = errors.New("backends: read tcp: connection reset by peer")

// Faulty wraps a real backend and injects the faults of a store reached
// over a network: Complete calls that fail (after committing, when
// CommitFirst is set: only the answer is lost) and lease extensions that
// hang. Set the fields before use.
type Faulty struct {
	TwoPhase
	// FailComplete is how many of the next Complete calls fail with
	// ErrConnReset.
	FailComplete atomic.Int64
	// CommitFirst makes a failing Complete commit on the real backend
	// before it returns ErrConnReset.
	CommitFirst bool
	// ExtendHang, if positive, makes every Extend wait this long, or
	// until its context ends, before reaching the real backend.
	ExtendHang time.Duration
	// Completes and ExtendsStarted count the calls.
	Completes, ExtendsStarted atomic.Int64
}

// Complete fails as FailComplete and CommitFirst say, else calls the
// real backend.
func (f *Faulty) Complete(ctx context.Context, p repository.CompleteParams) error {
	f.Completes.Add(1)
	if f.FailComplete.Add(-1) < 0 {
		return f.TwoPhase.Complete(ctx, p)
	}
	if f.CommitFirst {
		if err := f.TwoPhase.Complete(ctx, p); err != nil {
			return err
		}
	}
	return ErrConnReset
}

// Extend hangs as ExtendHang says, then calls the real backend.
func (f *Faulty) Extend(ctx context.Context, p repository.LeaseParams) error {
	f.ExtendsStarted.Add(1)
	if f.ExtendHang > 0 {
		t := time.NewTimer(f.ExtendHang)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return f.TwoPhase.Extend(ctx, p)
}
