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
func NewTwoPhase(c TwoPhaseConfig, name, prefix string) *TwoPhase {
	return &TwoPhase{
		Leases:    &lease.Keeper{Repo: c.Repo, Settings: c.Lease, Now: c.Now, Logger: c.Logger, Name: name},
		Retention: c.Retention, Reclaim: c.Policy == Reclaim, Prefix: prefix,
	}
}

// TwoPhase runs the protocol for effects outside a transaction: claim the
// key in progress under a lease, run the effect while the lease is kept
// alive, then complete the key with the result (or release it after a
// failure). Its fields are set once, before use; it is safe for
// concurrent use.
//
// A call waits for the store for at most about 2 × StoreTimeout (plus
// the effect's own time): the claim is bounded by StoreTimeout, and
// Complete or Release by what is left of 2 × StoreTimeout (at least one
// StoreTimeout); what the store has not answered by then goes on in the
// background (lease.Keeper.Drain), so a store that stops answering holds
// no call for long.
type TwoPhase struct {
	// Leases keeps and finishes the leases; its Repo is the store.
	Leases *lease.Keeper
	// Retention is how long a completed key is remembered.
	Retention time.Duration
	// Reclaim takes over a key whose earlier attempt's lease expired;
	// false answers Intervene.
	Reclaim bool
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
	held, a, ok := p.claim(ctx, c, lp)
	if !ok {
		return a
	}
	// The first extension comes ExtendEvery after the lease was taken,
	// not after the effect starts.
	first := max(0, p.Leases.ExtendEvery-p.Leases.Now().Sub(held))
	panicked, err := p.run(ctx, c, lp, first)
	budget := max(p.Leases.StoreTimeout, 2*p.Leases.StoreTimeout-a.Claim)
	if err != nil {
		// The claim goes so that the retry can run.
		if relErr := p.Leases.Release(ctx, lp, budget, c.Fields); relErr != nil && !errors.Is(relErr, lease.ErrPending) {
			p.Leases.Logger.Error(p.Leases.Name+": could not release the claim after a failed call; it frees when the lease expires", relErr, c.Fields)
		}
		return Answer{Kind: Ran, Err: err, Panic: panicked, Claim: a.Claim}
	}
	result, err := c.Result()
	if err != nil {
		p.Leases.Logger.Error(p.Leases.Name+": the effect happened but its result cannot be stored; the record stays in progress for an operator", err, c.Fields)
		return Answer{Kind: Ran, Err: fmt.Errorf("%s: key %q: %w", p.Prefix, c.Key, err), Claim: a.Claim}
	}
	if err := p.Leases.Complete(ctx, lp, result, budget, c.Fields); err != nil {
		// The effect happened but is not recorded yet: a newer owner holds
		// the key (repository.ErrLeaseLost), the store kept failing
		// through every retry, or it has not answered within the budget
		// and the retries go on in the background (lease.ErrPending). A
		// retry meets whatever the store says then.
		if !errors.Is(err, lease.ErrPending) {
			p.Leases.Logger.Error(p.Leases.Name+": could not complete the key after the call ran", err, c.Fields)
		}
		return Answer{Kind: Ran, Err: fmt.Errorf("%s: complete key %q: %w", p.Prefix, c.Key, err), Claim: a.Claim}
	}
	return Answer{Kind: Ran, Result: result, Claim: a.Claim}
}

// claim acquires the key, or answers the key taken: ok is true when this
// call holds the key (acquired, or reclaimed from an expired lease), and
// held is then when its lease began (on the lease clock). The answer's
// Claim is how long claiming took, when ok too.
//
// Every store call of a claim is bounded by StoreTimeout, so a claim
// that waits (on a lock, a slow store) comes back while its lease
// lasts. If one still comes back with less of its lease left than an
// extension may take (StoreTimeout), the lease is renewed before the
// effect may start: an effect never runs on a lease that has expired,
// or is about to, where another call could take the key over.
func (p *TwoPhase) claim(ctx context.Context, c Call, lp repository.LeaseParams) (held time.Time, _ Answer, ok bool) {
	start := time.Now()
	now := p.Leases.Now()
	var acq repository.Acquisition
	err := p.Leases.Call(ctx, func(ctx context.Context) (err error) {
		acq, err = p.Leases.Repo.Acquire(ctx, repository.AcquireParams{
			Consumer: c.Scope, Key: c.Key, PayloadHash: c.Hash, Owner: c.Owner,
			Now: now, LeaseUntil: now.Add(p.Leases.Lease), ExpiresAt: now.Add(p.Retention),
		})
		return err
	})
	if err != nil {
		p.Leases.ReleaseUnanswered(ctx, lp, err, c.Fields)
		return held, Answer{Kind: Unclaimed, Err: fmt.Errorf("%s: acquire key %q: %w", p.Prefix, c.Key, err), Claim: time.Since(start)}, false
	}
	if acq.Acquired {
		return p.ready(ctx, c, lp, now, start)
	}
	rec := acq.Existing
	a := Answer{Record: rec, Claim: time.Since(start)}
	switch {
	case settled(rec, c.Hash):
		a = Duplicate(c.Scope, c.Key, c.Hash, rec)
		a.Claim = time.Since(start)
		return held, a, false
	case rec.LeaseUntil.After(now):
		a.Kind, a.Err = Busy, &BusyError{Scope: c.Scope, Key: c.Key, Owner: rec.LeaseOwner, LeaseUntil: rec.LeaseUntil}
		return held, a, false
	case !p.Reclaim:
		a.Kind, a.Err = NeedsIntervention, fmt.Errorf("%w: scope %q, key %q: attempt %d by %s expired at %s", ErrNeedsIntervention, c.Scope, c.Key, rec.Attempts, rec.LeaseOwner, rec.LeaseUntil.Format(time.RFC3339Nano))
		return held, a, false
	}
	// The reclaimed lease runs from now, not from before the Acquire.
	now = p.Leases.Now()
	err = p.Leases.Call(ctx, func(ctx context.Context) error {
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
		return held, a, false
	case err != nil:
		p.Leases.ReleaseUnanswered(ctx, lp, err, c.Fields)
		a.Kind, a.Err = Unclaimed, fmt.Errorf("%s: reclaim key %q: %w", p.Prefix, c.Key, err)
		return held, a, false
	}
	p.Leases.Logger.Info(p.Leases.Name+": reclaimed an expired lease, running again", c.Fields.Add(watermill.LogFields{"previous_owner": rec.LeaseOwner}))
	return p.ready(ctx, c, lp, now, start)
}

// ready checks the lease this call took at since, before the effect may
// start: with less left than StoreTimeout it is renewed first (see
// claim). A renewal that fails gives the key up: ErrLeaseLost answers
// Busy (another call holds it now), any other error releases it in the
// background and answers Unclaimed, to be retried.
func (p *TwoPhase) ready(ctx context.Context, c Call, lp repository.LeaseParams, since, start time.Time) (held time.Time, _ Answer, ok bool) {
	now := p.Leases.Now()
	if since.Add(p.Leases.Lease).Sub(now) >= p.Leases.StoreTimeout {
		return since, Answer{Claim: time.Since(start)}, true
	}
	err := p.Leases.Renew(ctx, lp, now)
	a := Answer{Claim: time.Since(start)}
	switch {
	case err == nil:
		p.Leases.Logger.Info(p.Leases.Name+": the claim came back late; its lease was renewed before running", c.Fields.Add(watermill.LogFields{"claim": a.Claim}))
		return now, a, true
	case errors.Is(err, repository.ErrLeaseLost):
		a.Kind, a.Err = Busy, &BusyError{Scope: c.Scope, Key: c.Key}
		return since, a, false
	}
	p.Leases.ReleaseUnanswered(ctx, lp, err, c.Fields)
	a.Kind, a.Err = Unclaimed, fmt.Errorf("%s: key %q: the claim came back with its lease about to expire, and renewing it failed: %w", p.Prefix, c.Key, err)
	return since, a, false
}

// run runs c.Run while its lease is kept alive, the first extension
// after first, and recovers a panic so that the key is released before
// the panic goes on.
func (p *TwoPhase) run(parent context.Context, c Call, lp repository.LeaseParams, first time.Duration) (panicked any, err error) {
	ctx, cancel := context.WithCancelCause(parent)
	stopKeeping := p.Leases.Keep(ctx, lp, first, c.Fields, func(err error) { cancel(fmt.Errorf("%s: %w", p.Prefix, err)) })
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
