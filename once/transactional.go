package once

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Config configures a Transactional.
type Config struct {
	// DB is the database the call's transaction runs on; the repository's
	// table and the tables fn writes must live in it. Required.
	DB *sql.DB
	// Repository stores the markers: a SQL backend (postgres, mysql,
	// sqlite) created on DB. Required.
	Repository repository.Transactional
	// Scope is the consumer part of every record, as in TwoPhaseConfig. Required.
	Scope string
	// Retention is how long a completed key is remembered. Default:
	// idempotency.DefaultRetention (7 days).
	Retention time.Duration
	// TxOptions are used to begin the transaction. Default: nil.
	TxOptions *sql.TxOptions
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
	if c.DB == nil {
		errs = append(errs, errors.New("missing TxConfig.DB"))
	}
	if c.Repository == nil {
		errs = append(errs, errors.New("missing TxConfig.Repository"))
	}
	if err := checkScope("TxConfig.Scope", c.Scope); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, protocol.ValidateRetention(c.Retention, 0)...)
	return settings.Invalid("once", errs)
}

// TxFunc is the work Transactional.Do runs once per key, inside the
// transaction that holds the key's marker. It must write through tx and
// must not commit or roll it back.
type TxFunc func(ctx context.Context, tx *sql.Tx) ([]byte, error)

// Transactional runs a function once per (Scope, key) inside a SQL
// transaction that also claims the key, like middleware.Inbox: the
// marker, everything fn writes through the transaction and fn's output
// commit together or not at all. Transactional is safe for concurrent
// use.
type Transactional struct {
	calls
	now       func() time.Time
	retention time.Duration
	tx        protocol.Transactional[protocol.SQLTx]
}

// NewTransactional validates config and returns a Transactional.
func NewTransactional(config Config) (*Transactional, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Transactional{
		calls: calls{config.Scope, config.Observer, config.Logger}, now: config.Now, retention: config.Retention,
		tx: protocol.Transactional[protocol.SQLTx]{
			Prefix: "once", Begin: protocol.BeginSQL(config.DB, config.TxOptions, config.Repository),
		},
	}, nil
}

// Do runs fn once per key, with no input fingerprint: DoInput(ctx, key,
// nil, fn).
func (o *Transactional) Do(ctx context.Context, key string, fn TxFunc) (Result, error) {
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
func (o *Transactional) DoInput(ctx context.Context, key string, input []byte, fn TxFunc) (Result, error) {
	return o.do(ctx, key, fn == nil, func(ctx context.Context) protocol.Answer {
		now := o.now()
		return o.tx.Run(ctx, repository.ClaimParams{
			Consumer: o.scope, Key: key, PayloadHash: repository.HashPayload(input), Now: now, ExpiresAt: now.Add(o.retention),
		}, func(ctx context.Context, tx protocol.SQLTx) ([]byte, error) {
			return fn(withCall(ctx, o.scope, key), tx.Tx)
		})
	})
}
