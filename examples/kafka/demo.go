package main

// The demo around the service, which a real service does not need: a
// producer that re-sends orders with the same UUID, and the ledger read
// back from the database. The RabbitMQ example has the same file.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

const ordersPerRun = 12

// acks counts the deliveries each handler acknowledged. Its middleware
// goes before the inbox's, so a duplicate counts too, though the inbox
// skips its handler.
type acks struct {
	mu sync.Mutex
	n  map[string]int // by handler name
}

func (a *acks) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			a.mu.Lock()
			a.n[message.HandlerNameFromCtx(msg.Context())]++
			a.mu.Unlock()
		}
		return out, err
	}
}

func (a *acks) count(handler string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[handler]
}

// placeOrders publishes ordersPerRun orders to topic, every third one
// twice with the same UUID, as a producer does when a publish confirmation
// is lost. It waits until billing has acknowledged every message and
// receipts every payment, then prints the ledger. It fails unless every
// order was charged once and got one receipt.
func placeOrders(ctx context.Context, w io.Writer, db *sql.DB, pub message.Publisher, topic string, acked *acks) error {
	runID := watermill.NewShortUUID()[:8] // in every order ID: the ledger reads this run's rows
	published := 0
	for i := range ordersPerRun {
		payload, _ := json.Marshal(order{ID: fmt.Sprintf("%s-%03d", runID, i+1), Cents: int64(100 + i*250)})
		msg := message.NewMessage(watermill.NewUUID(), payload)
		for range 1 + (i%3)/2 {
			if err := pub.Publish(topic, msg.Copy()); err != nil {
				return err
			}
			published++
		}
	}
	for acked.count("billing") < published || acked.count("receipts") < ordersPerRun {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the deliveries: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}

	var charges, charged, cents, receipts int
	err := db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT order_id), COALESCE(SUM(cents), 0)
		FROM charges WHERE order_id LIKE $1`, runID+"-%").Scan(&charges, &charged, &cents)
	if err != nil {
		return err
	}
	err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM receipts WHERE payment LIKE $1`, `%"`+runID+`-%`).Scan(&receipts)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "run %s: %d orders published as %d messages (%d re-sent with the same UUID)\n",
		runID, ordersPerRun, published, published-ordersPerRun)
	fmt.Fprintf(w, "billing:  %d charges for %d orders, $%d.%02d; %d duplicates acknowledged without charging\n",
		charges, charged, cents/100, cents%100, acked.count("billing")-charges)
	fmt.Fprintf(w, "receipts: %d payments relayed from the outbox, %d receipts\n", acked.count("receipts"), receipts)
	if charges != ordersPerRun || charged != ordersPerRun || receipts != ordersPerRun {
		return fmt.Errorf("%d charges and %d receipts for %d orders", charges, receipts, ordersPerRun)
	}
	_, err = fmt.Fprintln(w, "every order charged exactly once, one receipt per payment")
	return err
}
