package idempotency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/watermill-idempotent/idempotency"
)

// A handler derives one key per downstream call from the key it is
// handling, so every layer dedupes its own step.
func ExampleDerive() {
	parent := "order-42"
	charge := idempotency.Derive(parent, "charge-card")
	fmt.Println(charge == idempotency.Derive(parent, "charge-card"))
	fmt.Println(charge == idempotency.Derive(parent, "send-receipt"))
	// Output:
	// true
	// false
}

// IsPermanent is the filter of Watermill's poison queue: a message no
// retry can fix is set aside instead of being redelivered forever.
func ExampleIsPermanent() {
	fmt.Println(idempotency.IsPermanent(fmt.Errorf("billing: %w", idempotency.ErrPayloadMismatch)))
	fmt.Println(idempotency.IsPermanent(idempotency.ErrInProgress))
	fmt.Println(idempotency.IsPermanent(errors.New("connection refused")))
	// Output:
	// true
	// false
	// false
}

type counter struct{ outcomes map[idempotency.Outcome]int }

func (c *counter) ObserveDelivery(_ context.Context, d idempotency.Delivery) { c.outcomes[d.Outcome]++ }

type printer struct{}

func (printer) StartDelivery(ctx context.Context, d idempotency.Delivery) context.Context {
	fmt.Println("start", d.Mode, d.Scope)
	return ctx
}

func (printer) ObserveDelivery(_ context.Context, d idempotency.Delivery) {
	fmt.Println("end", d.Outcome)
}

// Observers gives one entry point several observers, metrics and
// tracing say; each that is a DeliveryStarter is started too.
func ExampleObservers() {
	c := &counter{outcomes: map[idempotency.Outcome]int{}}
	obs := idempotency.Observers(c, nil, printer{})
	d := idempotency.Delivery{Scope: "shop/billing", Mode: idempotency.ModeTransactional}
	ctx := obs.(idempotency.DeliveryStarter).StartDelivery(context.Background(), d)
	d.Outcome = idempotency.OutcomeProcessed
	obs.ObserveDelivery(ctx, d)
	fmt.Println(c.outcomes[idempotency.OutcomeProcessed])
	// Output:
	// start transactional shop/billing
	// end processed
	// 1
}

func ExampleKeyFromContext() {
	_, ok := idempotency.KeyFromContext(context.Background())
	fmt.Println(ok) // outside a handler
	// Output: false
}
