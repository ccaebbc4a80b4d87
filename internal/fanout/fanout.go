// Package fanout is the body of the observer combinators
// (middleware.Observers, outbox.RelayObservers, janitor.Observers): one
// report goes to every observer implementing the part it belongs to,
// and a start part passes the context on from one observer to the next.
//
//	func (o observers) StartDelivery(ctx context.Context, d Delivery) context.Context {
//		return fanout.Start(ctx, o, d, DeliveryStarter.StartDelivery)
//	}
package fanout

import "context"

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
