package backends

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/idemkit/watermill-idempotent/idempotency"
)

// Deliveries is a idempotency.Observer that records every delivery it
// receives, for tests of the inboxes, once and httpidem.
type Deliveries struct {
	mu  sync.Mutex
	all []idempotency.Delivery
}

// ObserveDelivery implements idempotency.Observer.
func (d *Deliveries) ObserveDelivery(_ context.Context, dl idempotency.Delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, dl)
}

// All returns the deliveries received so far.
func (d *Deliveries) All() []idempotency.Delivery {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]idempotency.Delivery(nil), d.all...)
}

// Outcomes returns the outcomes of the deliveries received so far.
func (d *Deliveries) Outcomes() []idempotency.Outcome {
	var out []idempotency.Outcome
	for _, dl := range d.All() {
		out = append(out, dl.Outcome)
	}
	return out
}

// Lifecycle is a Deliveries that also starts each delivery
// (idempotency.DeliveryStarter) and counts the starts, so that a test can
// check every started delivery ended. PanicOnStart and PanicOnObserve
// make it panic in either call, after recording it, to check that an
// observer's panic changes nothing for the delivery.
type Lifecycle struct {
	Deliveries
	PanicOnStart, PanicOnObserve bool

	started atomic.Int64
}

// StartDelivery implements idempotency.DeliveryStarter.
func (l *Lifecycle) StartDelivery(ctx context.Context, _ idempotency.Delivery) context.Context {
	l.started.Add(1)
	if l.PanicOnStart {
		panic("observer panics in StartDelivery")
	}
	return ctx
}

// ObserveDelivery implements idempotency.Observer.
func (l *Lifecycle) ObserveDelivery(ctx context.Context, d idempotency.Delivery) {
	l.Deliveries.ObserveDelivery(ctx, d)
	if l.PanicOnObserve {
		panic("observer panics in ObserveDelivery")
	}
}

// Started is how many deliveries StartDelivery was called for.
func (l *Lifecycle) Started() int { return int(l.started.Load()) }
