// Package fanout is the body of the observer combinators
// (idempotency.Observers, outbox.RelayObservers, janitor.Observers): one
// report goes to every observer implementing the part it belongs to,
// and a start part passes the context on from one observer to the next.
//
//	func (o observers) StartDelivery(ctx context.Context, d Delivery) context.Context {
//		return fanout.Start(ctx, o, d, DeliveryStarter.StartDelivery)
//	}
package fanout

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill"
)

// Report calls report for each of obs implementing P, in order. Nil
// entries implement nothing.
func Report[O, P, V any](ctx context.Context, obs []O, v V, report func(P, context.Context, V)) {
	for _, o := range obs {
		if p, ok := any(o).(P); ok {
			report(p, ctx, v)
		}
	}
}

// Start calls start for each of obs implementing P, in order, each with
// the context the one before returned, and returns the last one.
func Start[O, P, V any](ctx context.Context, obs []O, v V, start func(P, context.Context, V) context.Context) context.Context {
	for _, o := range obs {
		if p, ok := any(o).(P); ok {
			ctx = start(p, ctx, v)
		}
	}
	return ctx
}

// Any reports whether one of obs implements P, so that a combinator
// offers an optional part, one that makes its caller do work, only when
// one of its observers takes it.
func Any[P, O any](obs []O) bool {
	for _, o := range obs {
		if _, ok := any(o).(P); ok {
			return true
		}
	}
	return false
}

// Started calls start(s, ctx, v) and returns the context it returned; if
// it panics, the panic is logged and ctx is returned: the delivery or
// batch goes on without what the starter would have added. Entry points
// start their deliveries and batches through it.
func Started[S, V any](ctx context.Context, s S, v V, start func(S, context.Context, V) context.Context, logger watermill.LoggerAdapter, fields watermill.LogFields) context.Context {
	started := ctx
	if p := safely(func() { started = start(s, ctx, v) }); p != nil {
		logger.Error("Observer panicked starting a delivery; it goes on without it", panicError(p), fields)
		return ctx
	}
	return started
}

// Reported calls report(o, ctx, v); a panic is logged, not raised. An
// observer that panics must not change what happens to what it reports:
// a panic after a commit would make the broker redeliver a message whose
// effects committed, on every redelivery and replay. Entry points report
// their deliveries and batches through it.
func Reported[O, V any](ctx context.Context, o O, v V, report func(O, context.Context, V), logger watermill.LoggerAdapter, fields watermill.LogFields) {
	if p := safely(func() { report(o, ctx, v) }); p != nil {
		logger.Error("Observer panicked reporting an outcome; the outcome stands", panicError(p), fields)
	}
}

func safely(call func()) (panicked any) {
	defer func() { panicked = recover() }()
	call()
	return nil
}

func panicError(p any) error { return fmt.Errorf("panic: %v\n%s", p, debug.Stack()) }
