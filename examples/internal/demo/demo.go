// Package demo is the demonstration around the rabbitmq and kafka example
// services, which a real service does not need: a producer that re-sends
// orders with the same UUID, a wait for every delivery, and the ledger
// read back from the database. The services themselves are in
// examples/rabbitmq/main.go and examples/kafka/main.go.
package demo

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

	"github.com/idemkit/watermill-idempotent/middleware"
)

// OrdersPerRun is how many orders Run places.
const OrdersPerRun = 12

// order is the payload the example services decode.
type order struct {
	ID    string `json:"id"`
	Cents int64  `json:"cents"`
}

// Run publishes OrdersPerRun orders to topic, every third one twice with
// the same UUID, as a producer does when a publish confirmation is lost;
// waits until seen has counted every delivery to billing and a receipt
// per order; and prints the ledger from the charges and receipts tables.
// It fails unless every order was charged once and got one receipt.
func Run(ctx context.Context, w io.Writer, db *sql.DB, pub message.Publisher, topic string,
	seen *Deliveries,
) error {
	runID := watermill.NewShortUUID()[:8] // in every order ID: the ledger reads this run's rows
	published := 0
	for i := range OrdersPerRun {
		o := order{ID: fmt.Sprintf("%s-%03d", runID, i+1), Cents: int64(100 + i*250)}
		payload, _ := json.Marshal(o)
		msg := message.NewMessage(watermill.NewUUID(), payload)
		for range 1 + (i%3)/2 {
			if err := pub.Publish(topic, msg.Copy()); err != nil {
				return err
			}
			published++
		}
	}
	for seen.count("billing") < published || seen.count("receipts") < OrdersPerRun {
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
	err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM receipts WHERE payment LIKE $1`, `%"`+runID+`-%`).
		Scan(&receipts)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "run %s: %d orders published as %d messages (%d re-sent with the same UUID)\n",
		runID, OrdersPerRun, published, published-OrdersPerRun)
	fmt.Fprintf(w, "billing:  %d charges for %d orders, $%d.%02d; ", charges, charged, cents/100, cents%100)
	fmt.Fprintf(w, "%d duplicates acknowledged without charging\n", seen.count("billing/duplicate"))
	fmt.Fprintf(w, "receipts: %d payments relayed from the outbox, %d receipts\n",
		seen.count("receipts"), receipts)
	if charges != OrdersPerRun || charged != OrdersPerRun || receipts != OrdersPerRun {
		return fmt.Errorf("%d charges and %d receipts for %d orders", charges, receipts, OrdersPerRun)
	}
	_, err = fmt.Fprintln(w, "every order charged exactly once, one receipt per payment")
	return err
}

// Deliveries is a middleware.Observer counting the inbox's outcomes per
// Watermill handler ("billing") and per handler and outcome
// ("billing/duplicate"), whatever the inbox's Consumer. The zero value is
// ready to use.
type Deliveries struct {
	mu     sync.Mutex
	counts map[string]int
}

// ObserveDelivery implements middleware.Observer.
func (d *Deliveries) ObserveDelivery(ctx context.Context, x middleware.Delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.counts == nil {
		d.counts = map[string]int{}
	}
	handler := message.HandlerNameFromCtx(ctx)
	d.counts[handler]++
	d.counts[handler+"/"+string(x.Outcome)]++
}

func (d *Deliveries) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts[key]
}
