// Package lease is the part of the two-phase protocol every entry point
// shares — the two-phase inbox of package middleware, once.TwoPhase and
// httpidem: the defaults and validation of the lease settings, keeping a
// claim's lease alive while the effect runs, and finishing it (Complete
// after a success, Release after a failure) with retries fenced by the
// owner, every store call bounded by StoreTimeout. The entry points differ
// in how they claim and how they answer; what happens to the lease is
// written here once.
package lease

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Defaults of Settings.
const (
	DefaultLease           = 30 * time.Second
	DefaultMaxAttempts     = 10
	DefaultInitialInterval = 100 * time.Millisecond
	DefaultMaxInterval     = 2 * time.Second
)

// Retry bounds the retries of the last store write, Complete or Release.
// Its fields are those of idempotency.FinishRetry, which converts to it.
type Retry struct {
	MaxAttempts     int
	InitialInterval time.Duration
	MaxInterval     time.Duration
}

// Settings are the lease settings of every two-phase entry point's
// config.
type Settings struct {
	Lease, ExtendEvery, StoreTimeout time.Duration
	Retry                            Retry
}

// SetDefaults fills the zero fields: DefaultLease, ExtendEvery Lease/3,
// StoreTimeout Lease/3 (the default ExtendEvery, not a shorter one the
// caller set, which would leave a slow store no time to answer), and the
// Retry defaults.
func (s *Settings) SetDefaults() {
	if s.Lease == 0 {
		s.Lease = DefaultLease
	}
	if s.ExtendEvery == 0 {
		s.ExtendEvery = s.Lease / 3
	}
	if s.StoreTimeout == 0 {
		s.StoreTimeout = s.Lease / 3
	}
	if s.Retry.MaxAttempts == 0 {
		s.Retry.MaxAttempts = DefaultMaxAttempts
	}
	if s.Retry.InitialInterval == 0 {
		s.Retry.InitialInterval = DefaultInitialInterval
	}
	if s.Retry.MaxInterval == 0 {
		s.Retry.MaxInterval = DefaultMaxInterval
	}
}

// Fill applies SetDefaults to the lease settings of a config, given by
// their fields.
func Fill(lease, extendEvery, storeTimeout *time.Duration, retry *Retry) {
	s := Settings{Lease: *lease, ExtendEvery: *extendEvery, StoreTimeout: *storeTimeout, Retry: *retry}
	s.SetDefaults()
	*lease, *extendEvery, *storeTimeout, *retry = s.Lease, s.ExtendEvery, s.StoreTimeout, s.Retry
}

// Validate reports every problem with s, and with a retention that does
// not outlast the lease, in the words of the configs (config.Lease,
// config.FinishRetry…).
func (s Settings) Validate(retention time.Duration) []error {
	var errs []error
	if s.Lease <= 0 {
		errs = append(errs, fmt.Errorf("config.Lease must be positive, got %s", s.Lease))
	}
	if s.ExtendEvery <= 0 || s.ExtendEvery >= s.Lease {
		errs = append(errs, fmt.Errorf("config.ExtendEvery must be positive and shorter than Lease (%s), got %s", s.Lease, s.ExtendEvery))
	}
	if retention <= s.Lease {
		errs = append(errs, fmt.Errorf("config.Retention (%s) must be longer than Lease (%s)", retention, s.Lease))
	}
	if s.StoreTimeout <= 0 || s.StoreTimeout >= s.Lease {
		errs = append(errs, fmt.Errorf("config.StoreTimeout must be positive and shorter than Lease (%s), got %s", s.Lease, s.StoreTimeout))
	} else if s.ExtendEvery > 0 && s.ExtendEvery+s.StoreTimeout >= s.Lease {
		// An extension sent ExtendEvery after the last may take
		// StoreTimeout to land: past Lease, a healthy call's lease would
		// expire in between and another could take the key over.
		errs = append(errs, fmt.Errorf("config.ExtendEvery (%s) + StoreTimeout (%s) must be shorter than Lease (%s): an extension must land before the lease it extends expires", s.ExtendEvery, s.StoreTimeout, s.Lease))
	}
	if s.Retry.MaxAttempts < 1 {
		errs = append(errs, fmt.Errorf("config.FinishRetry.MaxAttempts must be at least 1, got %d", s.Retry.MaxAttempts))
	}
	if s.Retry.InitialInterval <= 0 || s.Retry.MaxInterval < s.Retry.InitialInterval {
		errs = append(errs, fmt.Errorf("config.FinishRetry: InitialInterval (%s) must be positive and at most MaxInterval (%s)", s.Retry.InitialInterval, s.Retry.MaxInterval))
	}
	return errs
}

// Keeper keeps and finishes the leases of one entry point. Its fields
// are set once, before use; it is safe for concurrent use and must not
// be copied after first use.
type Keeper struct {
	Repo repository.TwoPhase
	Settings
	Now    func() time.Time
	Logger watermill.LoggerAdapter
	// Name starts every log message ("Inbox", "Once").
	Name string

	// background counts the store writes that calls left running when
	// their budget ran out (see Drain).
	background pending
}

// MaxBackground bounds the store writes one Keeper runs in the
// background, left there by calls whose budget ran out (see within).
// Each ends within Retry.MaxAttempts attempts; an outage that fails
// every call would otherwise pile them up. Past the bound a write is
// abandoned and the lease expires in its own time, as when every attempt
// fails.
const MaxBackground = 256

// Call runs one store call bounded by StoreTimeout.
func (k *Keeper) Call(ctx context.Context, call func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, k.StoreTimeout)
	defer cancel()
	return call(ctx)
}

// Keep extends lease every ExtendEvery, the first time after first (the
// rest of ExtendEvery when the lease was taken a while before the
// effect starts), each extension bounded by StoreTimeout, until the
// returned stop is called. If an extension finds the lease taken over,
// lost is called with the error and no extension follows. stop abandons
// an extension in flight (its context is cancelled) rather than waiting
// for the store's answer, and returns once the extending goroutine has
// ended; no extension starts after it. ctx carries values only: its
// cancellation does not stop the extensions, which must go on while the
// effect runs.
func (k *Keeper) Keep(ctx context.Context, lease repository.LeaseParams, first time.Duration, fields watermill.LogFields, lost func(error)) (stop func()) {
	extending, stopExtending := context.WithCancel(context.WithoutCancel(ctx))
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTimer(first)
		defer t.Stop()
		for {
			select {
			case <-extending.Done():
				return
			case <-t.C:
			}
			// select picks at random among ready cases: a tick pending when
			// stop was called must not start an extension.
			if extending.Err() != nil {
				return
			}
			t.Reset(k.ExtendEvery)
			lease.LeaseUntil = k.Now().Add(k.Lease)
			err := k.Call(extending, func(ctx context.Context) error { return k.Repo.Extend(ctx, lease) })
			switch {
			case extending.Err() != nil:
				return // stopped; the outcome no longer matters
			case errors.Is(err, repository.ErrLeaseLost):
				k.Logger.Error(k.Name+": lease lost while the handler runs; cancelling its context", err, fields)
				lost(err)
				return
			case err != nil:
				k.Logger.Error(k.Name+": could not extend the lease; retrying at the next tick", err, fields)
			}
		}
	}()
	return func() {
		stopExtending()
		<-stopped
	}
}

// Renew extends lease at once from now, bounded by StoreTimeout: for a
// claim that came back with little of its lease left.
func (k *Keeper) Renew(ctx context.Context, lease repository.LeaseParams, now time.Time) error {
	lease.LeaseUntil = now.Add(k.Lease)
	return k.Call(context.WithoutCancel(ctx), func(ctx context.Context) error { return k.Repo.Extend(ctx, lease) })
}

// ErrPending reports that a store write has not answered within the
// call's budget and goes on in the background (see Keeper.Complete).
var ErrPending = errors.New("the store has not answered in time; retrying in the background")

// Complete marks the key of lease completed with result, retrying as
// Retry allows. An earlier attempt that committed with its answer lost
// is recognised (the record is completed by this owner with this
// result) and counts as success. Complete waits for at most budget:
// then it returns an error wrapping ErrPending, and the attempts go on
// in the background (logged when they end; see Drain).
func (k *Keeper) Complete(ctx context.Context, lease repository.LeaseParams, result []byte, budget time.Duration, fields watermill.LogFields) error {
	return k.within(ctx, budget, "complete", fields, func(ctx context.Context) error {
		err, retried := k.finish(ctx, "complete", lease, fields, func(ctx context.Context) error {
			return k.Repo.Complete(ctx, repository.CompleteParams{
				Consumer: lease.Consumer, Key: lease.Key, Owner: lease.Owner, Result: result, Now: k.Now(),
			})
		})
		if errors.Is(err, repository.ErrLeaseLost) && retried && k.completedBy(ctx, lease, result) {
			// An earlier attempt committed and only its answer was lost
			// (the connection died after the commit): the record is
			// completed, by this owner, with this result.
			return nil
		}
		return err
	})
}

// Release deletes the claim of lease after a failed effect, retrying as
// Retry allows, and waiting for at most budget as Complete does. A lost
// lease is no error here: the key is free or someone else's, so nothing
// is left to release.
func (k *Keeper) Release(ctx context.Context, lease repository.LeaseParams, budget time.Duration, fields watermill.LogFields) error {
	return k.within(ctx, budget, "release", fields, func(ctx context.Context) error {
		err, _ := k.finish(ctx, "release", lease, fields, func(ctx context.Context) error {
			return k.Repo.Release(ctx, lease)
		})
		if errors.Is(err, repository.ErrLeaseLost) {
			return nil
		}
		return err
	})
}

// ReleaseUnanswered releases, in the background, a claim this attempt
// may hold without knowing it: an Acquire or Reclaim that failed with
// cause may have committed with only its answer lost (the connection
// died after the write). The key would then stay in progress under this
// attempt's owner with nobody working on it until its lease expired —
// and then Intervene would send a message whose effect never ran to an
// operator. The release is fenced by this attempt's owner, a no-op when
// the claim never happened — as it most often did not.
//
// The call does not wait for it. It is tried unansweredAttempts times at
// most (a pool hands out one more dead connection after its
// connections were cut), with Retry's pauses and no extension, and not
// at all when cause shows the claim's statement never reached the store
// (the call gave up waiting for a connection) or while MaxBackground
// writes run in the background already: after a restart every failed
// call would otherwise add writes of its own to the store's reconnects
// (six database/sql pools of twelve workers at a 100 ms StoreTimeout
// then never came back). A claim left behind frees when its lease
// expires.
func (k *Keeper) ReleaseUnanswered(ctx context.Context, lease repository.LeaseParams, cause error, fields watermill.LogFields) {
	var ns interface{ StatementNotSent() bool }
	if errors.Is(cause, repository.ErrInvalidParams) || errors.As(cause, &ns) && ns.StatementNotSent() || !k.background.add(MaxBackground) {
		return
	}
	ctx = context.WithoutCancel(ctx)
	go func() {
		defer k.background.done()
		wait := k.Retry.InitialInterval
		for attempt := 1; ; attempt++ {
			err := k.Call(ctx, func(ctx context.Context) error { return k.Repo.Release(ctx, lease) })
			if err == nil || errors.Is(err, repository.ErrLeaseLost) {
				return
			}
			if attempt >= min(unansweredAttempts, k.Retry.MaxAttempts) {
				k.Logger.Info(k.Name+": could not release a claim whose answer was lost; it frees when its lease expires", fields.Add(watermill.LogFields{"err": err.Error()}))
				return
			}
			time.Sleep(wait)
			wait = min(2*wait, k.Retry.MaxInterval)
		}
	}()
}

// unansweredAttempts bounds the releases of a claim whose answer was
// lost (ReleaseUnanswered).
const unansweredAttempts = 3

// within runs write in a goroutine and waits for it for at most budget.
// If it ends in time, its error is returned. Otherwise write goes on in
// the background, its outcome logged when it ends, and an error wrapping
// ErrPending is returned — unless MaxBackground writes run in the
// background already: then write's context is cancelled and the error
// says it was abandoned.
func (k *Keeper) within(ctx context.Context, budget time.Duration, op string, fields watermill.LogFields, write func(context.Context) error) error {
	ctx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu       sync.Mutex
		finished bool // write returned while the call waited
		result   error
		left     bool // the call left write to the background
	)
	done := make(chan struct{})
	go func() {
		defer abandon() // done with the context, whoever waited
		err := write(ctx)
		mu.Lock()
		defer mu.Unlock()
		if !left {
			finished, result = true, err
			close(done)
			return
		}
		defer k.background.done()
		if err != nil {
			k.Logger.Error(k.Name+": a store write left to the background failed; the lease expires in its own time", err, fields.Add(watermill.LogFields{"op": op}))
			return
		}
		k.Logger.Info(k.Name+": a store write left to the background succeeded", fields.Add(watermill.LogFields{"op": op}))
	}()
	t := time.NewTimer(budget)
	defer t.Stop()
	select {
	case <-done:
		return result
	case <-t.C:
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case finished:
		return result
	case !k.background.add(MaxBackground):
		abandon()
		return fmt.Errorf("%s: no answer within %s, and %d store writes run in the background already: abandoned; the lease expires in its own time", op, budget, MaxBackground)
	}
	left = true
	return fmt.Errorf("%s: no answer within %s: %w", op, budget, ErrPending)
}

// Drain waits until the store writes that calls left running in the
// background have ended, or ctx ends (its error then).
func (k *Keeper) Drain(ctx context.Context) error { return k.background.wait(ctx) }

// pending counts work in flight and tells when none is.
type pending struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls to 0; nil while n is 0
}

// add counts one more, unless limit are in flight already.
func (p *pending) add(limit int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n >= limit {
		return false
	}
	if p.n == 0 {
		p.idle = make(chan struct{})
	}
	p.n++
	return true
}

func (p *pending) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n--; p.n == 0 {
		close(p.idle)
		p.idle = nil
	}
}

func (p *pending) wait(ctx context.Context) error {
	p.mu.Lock()
	idle := p.idle
	p.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finish calls write until it succeeds, reports a lost lease or invalid
// parameters (no retry changes those), or Retry.MaxAttempts is reached;
// before each retry it waits and extends the lease, so that no other
// attempt takes the key over meanwhile. retried reports whether an
// earlier attempt failed, so that its write may have committed.
func (k *Keeper) finish(ctx context.Context, op string, lease repository.LeaseParams, fields watermill.LogFields, write func(context.Context) error) (err error, retried bool) {
	wait := k.Retry.InitialInterval
	for attempt := 1; ; attempt++ {
		err = k.Call(ctx, write)
		if err == nil || errors.Is(err, repository.ErrLeaseLost) || errors.Is(err, repository.ErrInvalidParams) || attempt >= k.Retry.MaxAttempts {
			return err, attempt > 1
		}
		k.Logger.Info(k.Name+": store write after the handler failed; retrying", fields.Add(watermill.LogFields{
			"op": op, "attempt": attempt, "retry_in": wait, "err": err.Error(),
		}))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("%s abandoned after %d attempts (last: %w): %w", op, attempt, err, ctx.Err()), true
		}
		wait = min(2*wait, k.Retry.MaxInterval)
		lease.LeaseUntil = k.Now().Add(k.Lease)
		extErr := k.Call(ctx, func(ctx context.Context) error { return k.Repo.Extend(ctx, lease) })
		if errors.Is(extErr, repository.ErrLeaseLost) {
			return fmt.Errorf("%s after %d attempts (last: %w): %w", op, attempt, err, extErr), true
		}
		// Another error extending: the store is still failing; the next
		// attempt finds out, still fenced by the owner.
	}
}

// completedBy reports whether the record of lease is completed by its
// owner with result; a completed record keeps the owner that completed it
// (repository.TwoPhase).
func (k *Keeper) completedBy(ctx context.Context, lease repository.LeaseParams, result []byte) bool {
	reader, ok := k.Repo.(repository.Reader)
	if !ok {
		return false
	}
	var rec repository.Record
	err := k.Call(ctx, func(ctx context.Context) (err error) {
		rec, err = reader.Get(ctx, lease.Consumer, lease.Key)
		return err
	})
	return err == nil && rec.State == repository.StateCompleted && rec.LeaseOwner == lease.Owner && bytes.Equal(rec.Result, result)
}
