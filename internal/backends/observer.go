package backends

import (
	"context"
	"sync"

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
