package backends

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/idemkit/watermill-idempotent/middleware"
)

// Deliveries is a middleware.Observer that records every delivery it
// receives, for tests of the inboxes, once and httpidem.
type Deliveries struct {
	mu  sync.Mutex
	all []middleware.Delivery
}

// ObserveDelivery implements middleware.Observer.
func (d *Deliveries) ObserveDelivery(_ context.Context, dl middleware.Delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, dl)
}

// All returns the deliveries received so far.
func (d *Deliveries) All() []middleware.Delivery {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]middleware.Delivery(nil), d.all...)
}

// Outcomes returns the outcomes of the deliveries received so far.
func (d *Deliveries) Outcomes() []middleware.Outcome {
	var out []middleware.Outcome
	for _, dl := range d.All() {
		out = append(out, dl.Outcome)
	}
	return out
}

// Lifecycle is a Deliveries that also starts each delivery
// (middleware.DeliveryStarter) and counts the starts, so that a test can
// check every started delivery ended. PanicOnStart and PanicOnObserve
// make it panic in either call, after recording it, to check that an
// observer's panic changes nothing for the delivery.
type Lifecycle struct {
	Deliveries
	PanicOnStart, PanicOnObserve bool

	started atomic.Int64
}

// StartDelivery implements middleware.DeliveryStarter.
func (l *Lifecycle) StartDelivery(ctx context.Context, _ middleware.Delivery) context.Context {
	l.started.Add(1)
	if l.PanicOnStart {
		panic("observer panics in StartDelivery")
	}
	return ctx
}

// ObserveDelivery implements middleware.Observer.
func (l *Lifecycle) ObserveDelivery(ctx context.Context, d middleware.Delivery) {
	l.Deliveries.ObserveDelivery(ctx, d)
	if l.PanicOnObserve {
		panic("observer panics in ObserveDelivery")
	}
}

// Started is how many deliveries StartDelivery was called for.
func (l *Lifecycle) Started() int { return int(l.started.Load()) }
