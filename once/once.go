package once

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/fanout"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Result is what Do returns for a call that did not fail.
type Result struct {
	// Value is the function's output: the bytes it returned in this call,
	// or the bytes stored by the call that ran it when Replayed is true.
	Value []byte
	// Replayed is true when the function did not run in this call because
	// an earlier call with the same key completed it.
	Replayed bool
}

// BusyError is returned (wrapping idempotency.ErrInProgress) when another
// call holds the key in progress. It is transient: try again after
// LeaseUntil, when the other call has completed, released or expired.
// Owner is the attempt holding the key (empty when unknown); LeaseUntil is
// when its lease runs out unless it is extended (zero when unknown).
type BusyError = repository.BusyError

// ErrNoKey is returned (wrapping idempotency.ErrNoKey) for an empty key.
var ErrNoKey = fmt.Errorf("once: %w", idempotency.ErrNoKey)

var errNilFunc = errors.New("once: nil function")

// modeOnce is the Delivery.Mode of a call.
const modeOnce = idempotency.ModeOnce

// begin refuses a call without a function, unreported, or without a
// key, reported to observer. Otherwise it starts the call with
// observer's DeliveryStarter, if any, and returns the context the call
// runs in.
func (c calls) begin(ctx context.Context, key string, noFunc bool) (context.Context, error) {
	if noFunc {
		return ctx, errNilFunc
	}
	if s, ok := c.observer.(idempotency.DeliveryStarter); ok {
		ctx = fanout.Started(ctx, s, idempotency.Delivery{Scope: c.scope, Mode: modeOnce, Key: key}, idempotency.DeliveryStarter.StartDelivery, c.logger, c.fields(key))
	}
	if key == "" {
		c.report(ctx, idempotency.Delivery{Scope: c.scope, Mode: modeOnce, Outcome: idempotency.OutcomeNoKey, Err: ErrNoKey})
		return ctx, ErrNoKey
	}
	return ctx, nil
}

// report tells the observer, if any, how a call ended.
func (c calls) report(ctx context.Context, d idempotency.Delivery) {
	if c.observer != nil {
		fanout.Reported(ctx, c.observer, d, idempotency.Observer.ObserveDelivery, c.logger, c.fields(d.Key))
	}
}

func (c calls) fields(key string) watermill.LogFields {
	return watermill.LogFields{"scope": c.scope, "key": key}
}

// checkScope tells why scope cannot be stored as a consumer, or nil.
func checkScope(field, scope string) error {
	if scope == "" {
		return fmt.Errorf("missing %s", field)
	}
	if err := protocol.CheckScope(scope); err != nil {
		return fmt.Errorf("%s %w", field, err)
	}
	return nil
}

// result returns the protocol's answer a to a call: fn's output when it
// ran, the stored one when a completed call is replayed, or the answer's
// error. It reports the call to observer (if any) first. A panic of fn
// goes on up.
func (c calls) result(ctx context.Context, start time.Time, key string, a protocol.Answer) (Result, error) {
	c.report(ctx, idempotency.Delivery{
		Scope: c.scope, Mode: modeOnce, Key: key, Outcome: idempotency.Outcome(a.Outcome()), Err: a.Err,
		Claim: a.Claim, Total: time.Since(start),
	})
	if a.Panic != nil {
		panic(a.Panic)
	}
	switch {
	case a.Err != nil:
		return Result{}, a.Err
	case a.Kind == protocol.Replay:
		return Result{Value: a.Record.Result, Replayed: true}, nil
	}
	return Result{Value: a.Result}, nil
}

// calls answers the calls of one scope, in either mode, and reports them
// to the observer.
type calls struct {
	scope    string
	observer idempotency.Observer
	logger   watermill.LoggerAdapter
}

// do answers one call: it refuses a call without a key or a function
// or else starts it (begin), runs the protocol with run in the context
// the observer started it in and returns the answer's result (result).
func (c calls) do(ctx context.Context, key string, noFunc bool, run func(ctx context.Context) protocol.Answer) (Result, error) {
	start := time.Now()
	ctx, err := c.begin(ctx, key, noFunc)
	if err != nil {
		return Result{}, err
	}
	return c.result(ctx, start, key, run(ctx))
}

// keyCtx carries the key and scope of the running call to fn.
type keyCtx struct{}

type callInfo struct{ scope, key string }

func withCall(ctx context.Context, scope, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, callInfo{scope, key})
}

// KeyFromContext returns the key of the call running fn, for deriving
// downstream idempotency keys (idempotency.Derive). ok is false outside Do.
func KeyFromContext(ctx context.Context) (key string, ok bool) {
	c, ok := ctx.Value(keyCtx{}).(callInfo)
	return c.key, ok && c.key != ""
}
