package once

import (
	"context"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/lease"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/repository"
)

// TwoPhaseConfig configures a TwoPhase.
type TwoPhaseConfig struct {
	// Repository stores the records: any repository.TwoPhase backend
	// (memory, redis, postgres, mysql, sqlite). Required.
	Repository repository.TwoPhase
	// Scope is the consumer part of every record, the name of the job or
	// step ("nightly-export", "stripe-webhook"). Keys of different scopes
	// never meet. Required; at most 255 bytes, valid UTF-8, no NUL byte.
	Scope string
	// Lease is how long a claim stays exclusive without being extended.
	// Default: idempotency.DefaultLease (30 s).
	Lease time.Duration
	// ExtendEvery is how often the lease of a running function is
	// extended. Default: Lease/3. Must be shorter than Lease.
	ExtendEvery time.Duration
	// OnExpiredLease decides what a call does with a key whose earlier
	// attempt's lease expired mid-run (crashed or hung): idempotency.Intervene
	// (ErrNeedsIntervention, record kept for an operator) or
	// idempotency.Reclaim (exactly one racing call takes over and runs fn
	// again). Default: idempotency.Intervene.
	OnExpiredLease idempotency.ExpiredLeasePolicy
	// Retention is how long a completed key is remembered. Default:
	// idempotency.DefaultRetention (7 days). Must be longer than Lease.
	Retention time.Duration
	// StoreTimeout bounds each store call: the claim, every lease
	// extension and every Complete or Release attempt. A hung call is
	// abandoned (its context cancelled) after it, so it can neither hold
	// Do nor outlive fn. Do waits for the store for at most about 2 ×
	// StoreTimeout besides fn's own time: a Complete or Release not
	// answered by then goes on in the background (see Drain), and Do
	// returns an error (a retry finds the key in progress, then
	// completed). Default: Lease/3, as in
	// middleware.TwoPhaseConfig (not a shorter ExtendEvery you set, which
	// would leave a slow store no time to answer). Must be shorter than
	// Lease.
	StoreTimeout time.Duration
	// FinishRetry bounds how Complete (and Release after fn failed) is
	// retried after a store error, as in middleware.TwoPhaseConfig: while
	// the lease is held and extended between attempts, fenced by the
	// owner. Default: see idempotency.FinishRetry (10 attempts over about
	// 11 s).
	FinishRetry idempotency.FinishRetry
	// Logger receives the logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
	// Observer, if set, receives every call's outcome as a
	// idempotency.Delivery with Consumer Scope and Mode "once"
	// (processed, replayed, payload_mismatch, lease_busy,
	// needs_intervention, no_key, failed), so metrics.Metrics counts
	// calls as it counts deliveries; a idempotency.DeliveryStarter starts
	// each call too, and fn runs in the context it returns (so
	// tracing.New(tp) gives each call a span, fn's spans under it).
	// Default: nil.
	Observer idempotency.Observer
}

func (c *TwoPhaseConfig) setDefaults() {
	lease.Fill(&c.Lease, &c.ExtendEvery, &c.StoreTimeout, (*lease.Retry)(&c.FinishRetry))
	protocol.SetDefaults(&c.Retention, idempotency.DefaultRetention, &c.Logger, &c.Now)
}

// protocol returns the settings the protocol's two-phase run takes.
func (c TwoPhaseConfig) protocol() protocol.TwoPhaseConfig {
	return protocol.TwoPhaseConfig{
		Repo: c.Repository, Policy: c.OnExpiredLease, Retention: c.Retention,
		Lease: lease.Settings{Lease: c.Lease, ExtendEvery: c.ExtendEvery, StoreTimeout: c.StoreTimeout, Retry: lease.Retry(c.FinishRetry)},
		Now:   c.Now, Logger: c.Logger,
	}
}

// Validate reports every problem with the configuration at once.
func (c TwoPhaseConfig) Validate() error {
	errs := c.protocol().Validate("Config")
	if err := checkScope("Config.Scope", c.Scope); err != nil {
		errs = append(errs, err)
	}
	return settings.Invalid("once", errs)
}

// Func is the work TwoPhase.Do runs once per key. Its output is stored
// and replayed to later calls with the same key.
type Func func(ctx context.Context) ([]byte, error)

// TwoPhase runs a function once per (Scope, key) on any backend, with the
// lease semantics of middleware.TwoPhaseInbox: claim the key in progress
// under a lease, run the function while extending the lease, then mark the
// key completed with the function's output, retrying that write while the
// lease is held, every store call bounded by StoreTimeout (the inbox's own
// code, shared). Use it for effects outside a SQL transaction (an HTTP
// call, an e-mail, a file); with writes to a SQL database, Transactional
// is stronger. TwoPhase is safe for concurrent use.
type TwoPhase struct {
	calls
	proto *protocol.TwoPhase
}

// NewTwoPhase validates config and returns a TwoPhase.
func NewTwoPhase(config TwoPhaseConfig) (*TwoPhase, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &TwoPhase{calls{config.Scope, config.Observer, config.Logger}, protocol.NewTwoPhase(config.protocol(), "Once", "once")}, nil
}

// Drain waits until the store writes that earlier calls left running in
// the background have ended, or ctx ends (its error then). A call waits
// for the store for at most about 2 × StoreTimeout besides fn's own
// time; a Complete or Release the store has not answered by then goes
// on in the background, retried as FinishRetry allows. Call Drain before
// the process exits, so that a result already computed is stored.
func (o *TwoPhase) Drain(ctx context.Context) error { return o.proto.Leases.Drain(ctx) }

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
//     idempotency.ErrPayloadMismatch (permanent);
//   - key in progress under a live lease (a concurrent call): *BusyError,
//     wrapping idempotency.ErrInProgress (transient);
//   - key in progress under an expired lease: OnExpiredLease decides —
//     idempotency.ErrNeedsIntervention (permanent, record kept), or
//     exactly one racing call reclaims it and runs fn again;
//   - fn returns an error or panics: the claim is released so that a
//     retry runs fn again; the error is returned (a panic is re-raised
//     after the release);
//   - fn outlives its lease and another call takes the key over: fn's
//     context is cancelled and its completion is refused with an error
//     wrapping repository.ErrLeaseLost — fn's effect happened, so make it
//     idempotent downstream with the key;
//   - storing fn's output fails: it is retried as FinishRetry allows,
//     the lease extended between attempts and every attempt fenced by
//     this call's owner; an attempt that committed with its answer lost
//     counts as success. Only when every attempt fails (or the lease was
//     lost meanwhile) is the store's error returned — fn's effect
//     happened, and the key stays in progress until its lease expires.
//
// Every store call is bounded by StoreTimeout, and Do waits for the
// store for at most about 2 × StoreTimeout besides fn's time (see
// StoreTimeout); when fn returns, a lease extension in flight is
// abandoned, so Do returns without waiting for it.
// An empty key is ErrNoKey.
func (o *TwoPhase) DoInput(ctx context.Context, key string, input []byte, fn Func) (Result, error) {
	return o.do(ctx, key, fn == nil, func(ctx context.Context) protocol.Answer {
		owner := watermill.NewUUID()
		var out []byte
		return o.proto.Do(ctx, protocol.Call{
			Scope: o.scope, Key: key, Owner: owner, Hash: repository.HashPayload(input),
			Fields: watermill.LogFields{"scope": o.scope, "key": key, "owner": owner},
			Run: func(ctx context.Context) (err error) {
				out, err = fn(withCall(ctx, o.scope, key))
				return err
			},
			Result: func() ([]byte, error) { return out, nil },
		})
	})
}
