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

// Hanging wraps a real backend; while Hang is set, every call waits
// until its context ends and returns its error, as a store that stops
// answering (a partition, a frozen server) does to a client that bounds
// its calls. Calls counts the calls that hung.
type Hanging struct {
	TwoPhase
	Hang  atomic.Bool
	Calls atomic.Int64
}

func (h *Hanging) hang(ctx context.Context) error {
	if !h.Hang.Load() {
		return nil
	}
	h.Calls.Add(1)
	<-ctx.Done()
	return ctx.Err()
}

// Acquire hangs while Hang is set.
func (h *Hanging) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if err := h.hang(ctx); err != nil {
		return repository.Acquisition{}, err
	}
	return h.TwoPhase.Acquire(ctx, p)
}

// Reclaim hangs while Hang is set.
func (h *Hanging) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	if err := h.hang(ctx); err != nil {
		return repository.Record{}, err
	}
	return h.TwoPhase.Reclaim(ctx, p)
}

// Extend hangs while Hang is set.
func (h *Hanging) Extend(ctx context.Context, p repository.LeaseParams) error {
	if err := h.hang(ctx); err != nil {
		return err
	}
	return h.TwoPhase.Extend(ctx, p)
}

// Complete hangs while Hang is set.
func (h *Hanging) Complete(ctx context.Context, p repository.CompleteParams) error {
	if err := h.hang(ctx); err != nil {
		return err
	}
	return h.TwoPhase.Complete(ctx, p)
}

// Release hangs while Hang is set.
func (h *Hanging) Release(ctx context.Context, p repository.LeaseParams) error {
	if err := h.hang(ctx); err != nil {
		return err
	}
	return h.TwoPhase.Release(ctx, p)
}

// Get hangs while Hang is set.
func (h *Hanging) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	if err := h.hang(ctx); err != nil {
		return repository.Record{}, err
	}
	return h.TwoPhase.Get(ctx, consumer, key)
}
