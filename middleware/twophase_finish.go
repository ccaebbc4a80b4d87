package middleware

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/repository"
)

// FinishRetry bounds the retries of a two-phase delivery's last store
// write — Complete after the handler succeeded, Release after it failed.
// Tried once, one transient store error after a successful effect would
// leave the key in progress: the redelivery then finds the lease expired
// and re-runs the effect (Reclaim) or sends an applied message to the
// poison queue (Intervene). Between attempts the lease is extended, so no
// other delivery takes the key over meanwhile; every attempt is fenced by
// the owner, so a retry after the lease was lost stops with
// repository.ErrLeaseLost and never overwrites the newer owner.
//
// With the defaults a delivery retries for about 11 s (waits of 0.1, 0.2,
// 0.4, 0.8 and 1.6 s, then 2 s four times) plus the attempts themselves,
// each bounded by TwoPhaseConfig.StoreTimeout: long enough to ride out a
// connection pool reconnecting after its connections were cut, or a
// database failing over, and well inside the default 30 s lease.
type FinishRetry struct {
	// MaxAttempts is the most calls, the first included; 1 turns retrying
	// off. Default: 10.
	MaxAttempts int
	// InitialInterval is the wait before the first retry; each later wait
	// doubles. Default: 100 ms.
	InitialInterval time.Duration
	// MaxInterval caps the wait between attempts. Default: 2 s.
	MaxInterval time.Duration
}

func (r *FinishRetry) setDefaults() {
	if r.MaxAttempts == 0 {
		r.MaxAttempts = 10
	}
	if r.InitialInterval == 0 {
		r.InitialInterval = 100 * time.Millisecond
	}
	if r.MaxInterval == 0 {
		r.MaxInterval = 2 * time.Second
	}
}

func (r FinishRetry) validate() []error {
	var errs []error
	if r.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("config.FinishRetry.MaxAttempts must be at least 1, got %d", r.MaxAttempts))
	}
	if r.InitialInterval <= 0 || r.MaxInterval < r.InitialInterval {
		errs = append(errs, fmt.Errorf("config.FinishRetry: InitialInterval (%s) must be positive and at most MaxInterval (%s)", r.InitialInterval, r.MaxInterval))
	}
	return errs
}

// storeCall runs one store call bounded by StoreTimeout.
func (i *TwoPhaseInbox) storeCall(ctx context.Context, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, i.config.StoreTimeout)
	defer cancel()
	return call(ctx)
}

// complete marks the key completed with result, retrying as FinishRetry
// allows.
func (i *TwoPhaseInbox) complete(ctx context.Context, lease repository.LeaseParams, result []byte, fields watermill.LogFields) error {
	c := i.config
	ctx = context.WithoutCancel(ctx)
	err, retried := i.finish(ctx, "complete", lease, fields, func(ctx context.Context) error {
		return c.Repository.Complete(ctx, repository.CompleteParams{
			Consumer: lease.Consumer, Key: lease.Key, Owner: lease.Owner, Result: result, Now: c.Now(),
		})
	})
	if errors.Is(err, repository.ErrLeaseLost) && retried && i.completedBy(ctx, lease, result) {
		// An earlier attempt committed and only its answer was lost (the
		// connection died after the commit): the record is completed, by
		// this owner, with this result.
		return nil
	}
	return err
}

// release deletes the claim after a failed handler, retrying as
// FinishRetry allows. A lost lease is no error here: the key is free or
// someone else's, so nothing is left to release.
func (i *TwoPhaseInbox) release(ctx context.Context, lease repository.LeaseParams, fields watermill.LogFields) error {
	c := i.config
	err, _ := i.finish(context.WithoutCancel(ctx), "release", lease, fields, func(ctx context.Context) error {
		return c.Repository.Release(ctx, lease)
	})
	if errors.Is(err, repository.ErrLeaseLost) {
		return nil
	}
	return err
}

// releaseUnanswered releases a claim this attempt may hold without
// knowing it: an Acquire or Reclaim that failed may have committed with
// only its answer lost (the connection died after the write). The key
// would then stay in progress under this attempt's owner with nobody
// working on it, until its lease expired — and then Intervene would send
// a message whose effect never ran to the poison queue. The release is
// fenced by this attempt's owner, a no-op when the claim never happened.
func (i *TwoPhaseInbox) releaseUnanswered(ctx context.Context, lease repository.LeaseParams, cause error, fields watermill.LogFields) {
	if errors.Is(cause, repository.ErrInvalidParams) {
		return // refused before any write
	}
	if err := i.release(ctx, lease, fields); err != nil {
		i.config.Logger.Error("Inbox: could not release a claim whose answer was lost; it frees when the lease expires", err, fields)
	}
}

// finish calls write until it succeeds, reports a lost lease or invalid
// parameters (no retry changes those), or FinishRetry.MaxAttempts is
// reached; before each retry it waits and extends the lease. retried
// reports whether an earlier attempt failed, so that its write may have
// committed.
func (i *TwoPhaseInbox) finish(ctx context.Context, op string, lease repository.LeaseParams, fields watermill.LogFields, write func(context.Context) error) (err error, retried bool) {
	c := i.config
	wait := c.FinishRetry.InitialInterval
	for attempt := 1; ; attempt++ {
		err = i.storeCall(ctx, write)
		if err == nil || errors.Is(err, repository.ErrLeaseLost) || errors.Is(err, repository.ErrInvalidParams) || attempt >= c.FinishRetry.MaxAttempts {
			return err, attempt > 1
		}
		c.Logger.Info("Inbox: store write after the handler failed; retrying", fields.Add(watermill.LogFields{
			"op": op, "attempt": attempt, "retry_in": wait, "err": err.Error(),
		}))
		time.Sleep(wait)
		wait = min(2*wait, c.FinishRetry.MaxInterval)
		lease.LeaseUntil = c.Now().Add(c.Lease)
		extErr := i.storeCall(ctx, func(ctx context.Context) error { return c.Repository.Extend(ctx, lease) })
		if errors.Is(extErr, repository.ErrLeaseLost) {
			return fmt.Errorf("inbox: %s after %d attempts (last: %w): %w", op, attempt, err, extErr), true
		}
		// Another error extending: the store is still failing; the next
		// attempt finds out, still fenced by the owner.
	}
}

// completedBy reports whether the record of lease is completed by its
// owner with result; a completed record keeps the owner that completed it
// (repository.TwoPhase).
func (i *TwoPhaseInbox) completedBy(ctx context.Context, lease repository.LeaseParams, result []byte) bool {
	reader, ok := i.config.Repository.(repository.Reader)
	if !ok {
		return false
	}
	var rec repository.Record
	err := i.storeCall(ctx, func(ctx context.Context) (err error) {
		rec, err = reader.Get(ctx, lease.Consumer, lease.Key)
		return err
	})
	return err == nil && rec.State == repository.StateCompleted && rec.LeaseOwner == lease.Owner && bytes.Equal(rec.Result, result)
}
