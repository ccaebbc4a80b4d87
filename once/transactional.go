package once

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/ctxkeys"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Config configures a Transactional.
type Config struct {
	// Scope is the consumer part of every record, as in TwoPhaseConfig. Required.
	Scope string
	// Retention is how long a completed key is remembered. Default:
	// idempotency.DefaultRetention (7 days).
	Retention time.Duration
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

func (c *Config) setDefaults() {
	protocol.SetDefaults(&c.Retention, idempotency.DefaultRetention, &c.Logger, &c.Now)
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if err := checkScope("Config.Scope", c.Scope); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, protocol.ValidateRetention(c.Retention, 0)...)
	return settings.Invalid("once", errs)
}

// TxFunc is the work Transactional.Do runs once per key, inside the
// transaction that holds the key's marker: a *sql.Tx or a pgx.Tx, the
// driver's. It must write through tx and must not commit or roll it back.
type TxFunc[TTx any] func(ctx context.Context, tx TTx) ([]byte, error)

// Transactional runs a function once per (Scope, key) inside a SQL
// transaction that also claims the key, like middleware.Inbox: the
// marker, everything fn writes through the transaction and fn's output
// commit together or not at all. Transactional is safe for concurrent
// use.
type Transactional[TTx any] struct {
	calls
	now       func() time.Time
	retention time.Duration
	tx        protocol.Transactional[protocol.DriverTx[TTx]]
}

// NewTransactional validates config and returns a Transactional whose
// transactions run on d: a SQL backend's repository
// (postgres.NewRepository or NewPgxRepository, mysql.NewRepository,
// sqlite.NewRepository) in the database fn writes to.
func NewTransactional[TTx any](d repository.Driver[TTx], config Config) (*Transactional[TTx], error) {
	config.setDefaults()
	err := config.Validate()
	if d == nil {
		err = errors.Join(errors.New("once: NewTransactional needs a repository.Driver (postgres.NewRepository, mysql.NewRepository, sqlite.NewRepository)"), err)
	}
	if err != nil {
		return nil, err
	}
	return &Transactional[TTx]{
		calls: calls{config.Scope, config.Observer, config.Logger}, now: config.Now, retention: config.Retention,
		tx: protocol.Transactional[protocol.DriverTx[TTx]]{
			Prefix: "once",
			BeginClaim: func(ctx context.Context, p repository.ClaimParams) (protocol.DriverTx[TTx], repository.Claim, error) {
				return protocol.BeginClaim(ctx, d, p)
			},
		},
	}, nil
}

// Do runs fn once per key, with no input fingerprint: DoInput(ctx, key,
// nil, fn).
func (o *Transactional[TTx]) Do(ctx context.Context, key string, fn TxFunc[TTx]) (Result, error) {
	return o.DoInput(ctx, key, nil, fn)
}

// DoInput begins a transaction, claims the key with one atomic conditional
// insert and, on a fresh claim, runs fn with the transaction and the key
// in its context (KeyFromContext); it stores fn's output with the marker
// and commits. Outcomes:
//
//   - first call (or the earlier one rolled back): fn runs; its writes,
//     the marker and its output commit together; Replayed false;
//   - key completed, same input: fn does not run; the stored output is
//     returned with Replayed true;
//   - key completed with other input: idempotency.ErrPayloadMismatch
//     (permanent);
//   - a concurrent call with the same key: waits on the database until
//     the first transaction ends, then replays (or claims, if the first
//     rolled back) — concurrent calls never both run fn;
//   - fn returns an error or panics, or the commit fails: everything rolls
//     back (no marker, no writes) and the error is returned (a panic is
//     re-raised), so a retry runs fn again.
//
// An empty key is ErrNoKey.
func (o *Transactional[TTx]) DoInput(ctx context.Context, key string, input []byte, fn TxFunc[TTx]) (Result, error) {
	return o.do(ctx, key, fn == nil, func(ctx context.Context) protocol.Answer {
		now := o.now()
		return o.tx.Run(ctx, repository.ClaimParams{
			Consumer: o.scope, Key: key, PayloadHash: repository.HashPayload(input), Now: now, ExpiresAt: now.Add(o.retention),
		}, func(ctx context.Context, tx protocol.DriverTx[TTx]) ([]byte, error) {
			return fn(ctxkeys.WithTx(withCall(ctx, o.scope, key), tx.Tx), tx.Tx)
		})
	})
}
