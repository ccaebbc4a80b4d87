package once

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Config configures a TwoPhase.
type Config struct {
	// Repository stores the records: any repository.TwoPhase backend
	// (memory, redis, postgres, mysql, sqlite). Required.
	Repository repository.TwoPhase
	// Scope is the consumer part of every record, the name of the job or
	// step ("nightly-export", "stripe-webhook"). Keys of different scopes
	// never meet. Required; at most 255 bytes, valid UTF-8, no NUL byte.
	Scope string
	// Lease is how long a claim stays exclusive without being extended.
	// Default: middleware.DefaultLease (30 s).
	Lease time.Duration
	// ExtendEvery is how often the lease of a running function is
	// extended. Default: Lease/3. Must be shorter than Lease.
	ExtendEvery time.Duration
	// OnExpiredLease decides what a call does with a key whose earlier
	// attempt's lease expired mid-run (crashed or hung): middleware.Intervene
	// (ErrNeedsIntervention, record kept for an operator) or
	// middleware.Reclaim (exactly one racing call takes over and runs fn
	// again). Default: middleware.Intervene.
	OnExpiredLease middleware.ExpiredLeasePolicy
	// Retention is how long a completed key is remembered. Default:
	// middleware.DefaultRetention (7 days). Must be longer than Lease.
	Retention time.Duration
	// Logger receives the logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Lease == 0 {
		c.Lease = middleware.DefaultLease
	}
	if c.ExtendEvery == 0 {
		c.ExtendEvery = c.Lease / 3
	}
	if c.Retention == 0 {
		c.Retention = middleware.DefaultRetention
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Repository == nil {
		errs = append(errs, errors.New("missing Config.Repository"))
	}
	if err := checkScope("Config.Scope", c.Scope); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, validateRetention(c.Retention)...)
	if c.Lease <= 0 {
		errs = append(errs, fmt.Errorf("config.Lease must be positive, got %s", c.Lease))
	}
	if c.ExtendEvery <= 0 || c.ExtendEvery >= c.Lease {
		errs = append(errs, fmt.Errorf("config.ExtendEvery must be positive and shorter than Lease (%s), got %s", c.Lease, c.ExtendEvery))
	}
	if c.OnExpiredLease != middleware.Intervene && c.OnExpiredLease != middleware.Reclaim {
		errs = append(errs, fmt.Errorf("config.OnExpiredLease: unknown policy %s", c.OnExpiredLease))
	}
	if c.Retention <= c.Lease {
		errs = append(errs, fmt.Errorf("config.Retention (%s) must be longer than Lease (%s)", c.Retention, c.Lease))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid once config: %w", err)
	}
	return nil
}

// Func is the work TwoPhase.Do runs once per key. Its output is stored
// and replayed to later calls with the same key.
type Func func(ctx context.Context) ([]byte, error)

// TwoPhase runs a function once per (Scope, key) on any backend, with the
// lease semantics of middleware.TwoPhaseInbox: claim the key in progress
// under a lease, run the function while extending the lease, then mark the
// key completed with the function's output. Use it for effects outside a
// SQL transaction (an HTTP call, an e-mail, a file); with writes to a SQL
// database, Transactional is stronger. TwoPhase is safe for concurrent
// use.
type TwoPhase struct {
	config Config
}

// NewTwoPhase validates config and returns a TwoPhase.
func NewTwoPhase(config Config) (*TwoPhase, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &TwoPhase{config: config}, nil
}

// Do runs fn once per key, with no input fingerprint: DoInput(ctx, key,
// nil, fn).
func (o *TwoPhase) Do(ctx context.Context, key string, fn Func) (Result, error) {
	return o.DoInput(ctx, key, nil, fn)
}

// DoInput runs fn unless a call with the same key already completed it,
// and returns fn's output either way. input identifies what the call is
// about (a request body, a file's checksum); its SHA-256 is stored, and a
// later call with the same key and other input fails. Outcomes:
//
//   - first call (or the earlier one failed): fn runs with the key in its
//     context (KeyFromContext) and its lease extended every ExtendEvery;
//     its output is stored and returned with Replayed false;
//   - key completed, same input: fn does not run; the stored output is
//     returned with Replayed true;
//   - key completed or in progress with other input:
//     middleware.ErrPayloadMismatch (permanent);
//   - key in progress under a live lease (a concurrent call): *BusyError,
//     wrapping middleware.ErrInProgress (transient);
//   - key in progress under an expired lease: OnExpiredLease decides —
//     middleware.ErrNeedsIntervention (permanent, record kept), or
//     exactly one racing call reclaims it and runs fn again;
//   - fn returns an error or panics: the claim is released so that a
//     retry runs fn again; the error is returned (a panic is re-raised
//     after the release);
//   - fn outlives its lease and another call takes the key over: fn's
//     context is cancelled and its completion is refused with an error
//     wrapping repository.ErrLeaseLost — fn's effect happened, so make it
//     idempotent downstream with the key.
//
// An empty key is ErrNoKey.
func (o *TwoPhase) DoInput(ctx context.Context, key string, input []byte, fn Func) (Result, error) {
	c := o.config
	if key == "" {
		return Result{}, ErrNoKey
	}
	if fn == nil {
		return Result{}, errNilFunc
	}
	scope := c.Scope
	hash := repository.HashPayload(input)
	owner := watermill.NewUUID()
	now := c.Now()
	acq, err := c.Repository.Acquire(ctx, repository.AcquireParams{
		Consumer: scope, Key: key, PayloadHash: hash, Owner: owner,
		Now: now, LeaseUntil: now.Add(c.Lease), ExpiresAt: now.Add(c.Retention),
	})
	if err != nil {
		return Result{}, fmt.Errorf("once: acquire key %q: %w", key, err)
	}
	fields := watermill.LogFields{"scope": scope, "key": key, "owner": owner}
	if !acq.Acquired {
		rec := acq.Existing
		switch {
		case !bytes.Equal(rec.PayloadHash, hash), rec.State == repository.StateCompleted:
			return replay(scope, key, hash, rec)
		case rec.LeaseUntil.After(now):
			return Result{}, &BusyError{Scope: scope, Key: key, Owner: rec.LeaseOwner, LeaseUntil: rec.LeaseUntil}
		case c.OnExpiredLease == middleware.Intervene:
			return Result{}, fmt.Errorf("%w: scope %q, key %q: attempt %d by %s expired at %s", middleware.ErrNeedsIntervention, scope, key, rec.Attempts, rec.LeaseOwner, rec.LeaseUntil.Format(time.RFC3339Nano))
		}
		if _, err := c.Repository.Reclaim(ctx, repository.ReclaimParams{
			Consumer: scope, Key: key, PrevOwner: rec.LeaseOwner, Owner: owner,
			Now: now, LeaseUntil: now.Add(c.Lease),
		}); errors.Is(err, repository.ErrLeaseLost) {
			return Result{}, &BusyError{Scope: scope, Key: key}
		} else if err != nil {
			return Result{}, fmt.Errorf("once: reclaim key %q: %w", key, err)
		}
		c.Logger.Info("Once: reclaimed an expired lease, running again", fields.Add(watermill.LogFields{"previous_owner": rec.LeaseOwner}))
	}

	lease := repository.LeaseParams{Consumer: scope, Key: key, Owner: owner}
	out, err := o.runLeased(ctx, fn, lease, fields)
	if err != nil {
		if relErr := c.Repository.Release(context.WithoutCancel(ctx), lease); relErr != nil && !errors.Is(relErr, repository.ErrLeaseLost) {
			c.Logger.Error("Once: could not release the claim after a failed call; it frees when the lease expires", relErr, fields)
		}
		var p panicError
		if errors.As(err, &p) {
			panic(p.value)
		}
		return Result{}, err
	}
	if err := c.Repository.Complete(context.WithoutCancel(ctx), repository.CompleteParams{
		Consumer: scope, Key: key, Owner: owner, Result: out, Now: c.Now(),
	}); err != nil {
		c.Logger.Error("Once: could not complete the key after the call ran", err, fields)
		return Result{}, fmt.Errorf("once: complete key %q: %w", key, err)
	}
	return Result{Value: out}, nil
}

// runLeased runs fn while a goroutine extends the lease; a panic of fn
// comes back as a panicError so that the caller releases first.
func (o *TwoPhase) runLeased(parent context.Context, fn Func, lease repository.LeaseParams, fields watermill.LogFields) (out []byte, err error) {
	c := o.config
	ctx, cancel := context.WithCancelCause(withCall(parent, lease.Consumer, lease.Key))
	stopped := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(c.ExtendEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				lease.LeaseUntil = c.Now().Add(c.Lease)
				err := c.Repository.Extend(context.WithoutCancel(ctx), lease)
				if errors.Is(err, repository.ErrLeaseLost) {
					c.Logger.Error("Once: lease lost while the call runs; cancelling its context", err, fields)
					cancel(fmt.Errorf("once: %w", err))
					return
				}
				if err != nil {
					c.Logger.Error("Once: could not extend the lease; retrying", err, fields)
				}
			}
		}
	}()
	defer func() {
		close(done)
		<-stopped
		cancel(nil)
	}()
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, panicError{p}
		}
	}()
	return fn(ctx)
}
