package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/internal/lease"
	"github.com/idemkit/watermill-idempotent/repository"
)

// ExpiredLeasePolicy is repository's: what a call does with a key in
// progress under an expired lease.
type ExpiredLeasePolicy = repository.ExpiredLeasePolicy

// The policies.
const (
	Intervene = repository.Intervene
	Reclaim   = repository.Reclaim
)

// TwoPhaseConfig holds the settings every two-phase entry point's config
// has, with their defaults applied.
type TwoPhaseConfig struct {
	Repo                        repository.TwoPhase
	Lease                       lease.Settings
	Policy                      ExpiredLeasePolicy
	Retention, RedeliveryWindow time.Duration
	Now                         func() time.Time
	Logger                      watermill.LoggerAdapter
}

// Validate reports every problem with c's repository, retention, lease
// settings and policy; config names the entry point's config type in the
// error about a missing repository ("TwoPhaseConfig").
func (c TwoPhaseConfig) Validate(config string) []error {
	var errs []error
	if c.Repo == nil {
		errs = append(errs, fmt.Errorf("missing %s.Repository", config))
	}
	errs = append(errs, ValidateRetention(c.Retention, c.RedeliveryWindow)...)
	errs = append(errs, c.Lease.Validate(c.Retention)...)
	if c.Policy != Intervene && c.Policy != Reclaim {
		errs = append(errs, fmt.Errorf("config.OnExpiredLease: unknown policy %s", c.Policy))
	}
	return errs
}

// NewTwoPhase returns the TwoPhase of an entry point: name starts its
// log messages ("Inbox"), prefix its errors ("inbox").
func NewTwoPhase(c TwoPhaseConfig, name, prefix string, boundClaim bool) *TwoPhase {
	return &TwoPhase{
		Leases:    &lease.Keeper{Repo: c.Repo, Settings: c.Lease, Now: c.Now, Logger: c.Logger, Name: name},
		Retention: c.Retention, Reclaim: c.Policy == Reclaim, BoundClaim: boundClaim, Prefix: prefix,
	}
}

// TwoPhase runs the protocol for effects outside a transaction: claim the
// key in progress under a lease, run the effect while the lease is kept
// alive, then complete the key with the result (or release it after a
// failure). Its fields are set once, before use; it is safe for
// concurrent use.
type TwoPhase struct {
	// Leases keeps and finishes the leases; its Repo is the store.
	Leases *lease.Keeper
	// Retention is how long a completed key is remembered.
	Retention time.Duration
	// Reclaim takes over a key whose earlier attempt's lease expired;
	// false answers Intervene.
	Reclaim bool
	// BoundClaim bounds the claim (Acquire, Reclaim) by StoreTimeout too.
	BoundClaim bool
	// Prefix starts every error ("inbox", "once").
	Prefix string
}

// Call is one call of a TwoPhase.
type Call struct {
	Scope, Key, Owner string
	// Hash is the input's fingerprint (repository.HashPayload).
	Hash []byte
	// Fields are the call's log fields (nil: logged without).
	Fields watermill.LogFields
	// Run is the effect. It runs with the key claimed, in a context
	// cancelled if the lease is lost. An error or a panic releases the
	// key, so that a retry runs it again.
	Run func(ctx context.Context) error
	// Result returns the result to store once Run succeeded. An error
	// leaves the key in progress (the effect happened) for an operator.
	Result func() ([]byte, error)
}

// Do runs c.
func (p *TwoPhase) Do(ctx context.Context, c Call) Answer {
	lp := repository.LeaseParams{Consumer: c.Scope, Key: c.Key, Owner: c.Owner}
	if a, ok := p.claim(ctx, c, lp); !ok {
		return a
	}
	if panicked, err := p.run(ctx, c, lp); err != nil {
		// The claim goes so that the retry can run.
		if relErr := p.Leases.Release(ctx, lp, c.Fields); relErr != nil {
			p.Leases.Logger.Error(p.Leases.Name+": could not release the claim after a failed call; it frees when the lease expires", relErr, c.Fields)
		}
		return Answer{Kind: Ran, Err: err, Panic: panicked}
	}
	result, err := c.Result()
	if err != nil {
		p.Leases.Logger.Error(p.Leases.Name+": the effect happened but its result cannot be stored; the record stays in progress for an operator", err, c.Fields)
		return Answer{Kind: Ran, Err: fmt.Errorf("%s: key %q: %w", p.Prefix, c.Key, err)}
	}
	if err := p.Leases.Complete(ctx, lp, result, c.Fields); err != nil {
		// The effect happened but cannot be recorded: a newer owner holds
		// the key (repository.ErrLeaseLost) or the store kept failing
		// through every retry. A retry meets whatever the store says then.
		p.Leases.Logger.Error(p.Leases.Name+": could not complete the key after the call ran", err, c.Fields)
		return Answer{Kind: Ran, Err: fmt.Errorf("%s: complete key %q: %w", p.Prefix, c.Key, err)}
	}
	return Answer{Kind: Ran, Result: result}
}

// claim acquires the key, or answers the key taken: ok is true when this
// call holds the key (acquired, or reclaimed from an expired lease).
func (p *TwoPhase) claim(ctx context.Context, c Call, lp repository.LeaseParams) (_ Answer, ok bool) {
	start := time.Now()
	now := p.Leases.Now()
	var acq repository.Acquisition
	err := p.call(ctx, func(ctx context.Context) (err error) {
		acq, err = p.Leases.Repo.Acquire(ctx, repository.AcquireParams{
			Consumer: c.Scope, Key: c.Key, PayloadHash: c.Hash, Owner: c.Owner,
			Now: now, LeaseUntil: now.Add(p.Leases.Lease), ExpiresAt: now.Add(p.Retention),
		})
		return err
	})
	took := time.Since(start)
	if err != nil {
		p.Leases.ReleaseUnanswered(ctx, lp, err, c.Fields)
		return Answer{Kind: Unclaimed, Err: fmt.Errorf("%s: acquire key %q: %w", p.Prefix, c.Key, err), Claim: took}, false
	}
	if acq.Acquired {
		return Answer{}, true
	}
	rec := acq.Existing
	a := Answer{Record: rec, Claim: took}
	switch {
	case settled(rec, c.Hash):
		a = Duplicate(c.Scope, c.Key, c.Hash, rec)
		a.Claim = took
		return a, false
	case rec.LeaseUntil.After(now):
		a.Kind, a.Err = Busy, &BusyError{Scope: c.Scope, Key: c.Key, Owner: rec.LeaseOwner, LeaseUntil: rec.LeaseUntil}
		return a, false
	case !p.Reclaim:
		a.Kind, a.Err = NeedsIntervention, fmt.Errorf("%w: scope %q, key %q: attempt %d by %s expired at %s", ErrNeedsIntervention, c.Scope, c.Key, rec.Attempts, rec.LeaseOwner, rec.LeaseUntil.Format(time.RFC3339Nano))
		return a, false
	}
	err = p.call(ctx, func(ctx context.Context) error {
		_, err := p.Leases.Repo.Reclaim(ctx, repository.ReclaimParams{
			Consumer: c.Scope, Key: c.Key, PrevOwner: rec.LeaseOwner, Owner: c.Owner,
			Now: now, LeaseUntil: now.Add(p.Leases.Lease),
		})
		return err
	})
	a.Claim = time.Since(start)
	switch {
	case errors.Is(err, repository.ErrLeaseLost):
		// Another call reclaimed it first (or it completed): retry later.
		a.Kind, a.Err = Busy, &BusyError{Scope: c.Scope, Key: c.Key}
		return a, false
	case err != nil:
		p.Leases.ReleaseUnanswered(ctx, lp, err, c.Fields)
		a.Kind, a.Err = Unclaimed, fmt.Errorf("%s: reclaim key %q: %w", p.Prefix, c.Key, err)
		return a, false
	}
	p.Leases.Logger.Info(p.Leases.Name+": reclaimed an expired lease, running again", c.Fields.Add(watermill.LogFields{"previous_owner": rec.LeaseOwner}))
	return Answer{}, true
}

// call runs a claim's store call, bounded by StoreTimeout if BoundClaim.
func (p *TwoPhase) call(ctx context.Context, call func(context.Context) error) error {
	if p.BoundClaim {
		return p.Leases.Call(ctx, call)
	}
	return call(ctx)
}

// run runs c.Run while its lease is kept alive, and recovers a panic so
// that the key is released before the panic goes on.
func (p *TwoPhase) run(parent context.Context, c Call, lp repository.LeaseParams) (panicked any, err error) {
	ctx, cancel := context.WithCancelCause(parent)
	stopKeeping := p.Leases.Keep(ctx, lp, c.Fields, func(err error) { cancel(fmt.Errorf("%s: %w", p.Prefix, err)) })
	defer func() {
		stopKeeping()
		cancel(nil)
	}()
	defer func() {
		if r := recover(); r != nil {
			panicked, err = r, fmt.Errorf("%s: handler panicked: %v", p.Prefix, r)
		}
	}()
	return nil, c.Run(ctx)
}
