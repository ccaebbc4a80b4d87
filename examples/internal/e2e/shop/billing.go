// Package shop is the small domain of the end-to-end harness
// (examples/internal/e2e): an order-placed event charges a customer and emits
// payment-completed, and a downstream receipts service consumes that.
//
// The handlers (Billing.Handle, Receipts.Handle) are ordinary Watermill
// handlers. They write through the inbox transaction
// (idempotency.Tx), so a charge commits together with the
// "already processed" marker, and they do not know which broker delivers
// to them: Run wires them to whatever broker.Open returned.
//
//	inbox, _ := middleware.NewInbox(repo, middleware.Config{ Consumer: "shop",
//		Outputs: ob.Outputs("payments")}) // payments leave through the outbox
//	billing := &shop.Billing{Store: store}
//	router.AddHandler("billing", "orders", sub, "payments", pub, billing.Handle)
//	router.AddMiddleware(poisonQueue, inbox.Middleware)
//
// Run plays the whole scenario — competing consumers, producer retries,
// failures, crashes before ack, poison messages — and returns the Ledger.
package shop

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// OrderPlaced is published by the orders service for every order.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount_cents"`
}

// PaymentCompleted is emitted by billing once it charged an order.
type PaymentCompleted struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount_cents"`
}

// ErrCardDeclined is the transient failure the fault injection returns:
// the charge rolls back and the broker redelivers the order.
var ErrCardDeclined = errors.New("card network timeout")

// Billing charges customers for placed orders and emits PaymentCompleted.
type Billing struct {
	// Store holds the charges table.
	Store *Store
	// FailOnce, when set, is asked before each charge commits; true makes
	// this attempt fail (fault injection).
	FailOnce func(OrderPlaced) bool
}

// Handle is the billing handler. It must run inside an inbox: it charges
// through the inbox transaction, so the charge, the marker and (with the
// inbox's Outputs set to an outbox) the payment event commit together or
// not at all.
func (b *Billing) Handle(msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	var o OrderPlaced
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, fmt.Errorf("decoding order %s: %w", msg.UUID, err)
	}
	tx, err := idempotency.Tx[*sql.Tx](ctx)
	if err != nil {
		return nil, err
	}
	markRan(ctx)
	if err := b.Store.Charge(ctx, tx, o); err != nil {
		return nil, err
	}
	if b.FailOnce != nil && b.FailOnce(o) {
		return nil, fmt.Errorf("charging order %s: %w", o.OrderID, ErrCardDeclined) // rolls the charge back
	}

	// The payment's UUID is a function of the handler's scope and the
	// order's key: a re-run after a rollback produces the same UUID, so
	// downstream dedupes it.
	key, _ := idempotency.KeyFromContext(ctx)
	scope, _ := idempotency.ScopeFromContext(ctx)
	payload, err := json.Marshal(PaymentCompleted(o))
	if err != nil {
		return nil, err
	}
	payment := message.NewMessage(middleware.OutputUUID(scope, key, 0), payload)
	wmiddleware.SetCorrelationID(wmiddleware.MessageCorrelationID(msg), payment)

	// Where the payment goes is the inbox's configuration, not the
	// handler's: with middleware.Config.Outputs set to an outbox, it is
	// written in this transaction and a relay publishes it; without, the
	// router publishes it after the commit and the inbox replays it to
	// duplicates.
	return []*message.Message{payment}, nil
}

// Receipts is the downstream consumer of PaymentCompleted: it records one
// receipt per payment.
type Receipts struct {
	Store *Store
}

// Handle records a receipt in the inbox transaction.
func (r *Receipts) Handle(msg *message.Message) error {
	ctx := msg.Context()
	var p PaymentCompleted
	if err := json.Unmarshal(msg.Payload, &p); err != nil {
		return fmt.Errorf("decoding payment %s: %w", msg.UUID, err)
	}
	tx, err := idempotency.Tx[*sql.Tx](ctx)
	if err != nil {
		return err
	}
	return r.Store.Receipt(ctx, tx, msg.UUID, p)
}

// ranKey marks, in a delivery's context, that the billing handler ran for
// it (the inbox claimed it), as opposed to a duplicate.
type ranKey struct{}

func withRanFlag(ctx context.Context) (context.Context, *bool) {
	ran := new(bool)
	return context.WithValue(ctx, ranKey{}, ran), ran
}

func markRan(ctx context.Context) {
	if ran, ok := ctx.Value(ranKey{}).(*bool); ok {
		*ran = true
	}
}
