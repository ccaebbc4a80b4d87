package main

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

// The demonstration around the service, which your service does not need:
// a producer that re-sends, a wait for every delivery, and the ledger.

const ordersPerRun = 12

// demo publishes ordersPerRun orders, every third one twice with the same
// UUID, waits until the inbox has seen every delivery and prints the
// ledger from the database.
func demo(ctx context.Context, w io.Writer, db *sql.DB, pub message.Publisher, topic string,
	seen *deliveries,
) error {
	runID := watermill.NewShortUUID()[:8] // in every order ID: the ledger reads this run's rows
	published := 0
	for i := range ordersPerRun {
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
	for seen.count("billing") < published || seen.count("receipts") < ordersPerRun {
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
		runID, ordersPerRun, published, published-ordersPerRun)
	fmt.Fprintf(w, "billing:  %d charges for %d orders, $%d.%02d; ", charges, charged, cents/100, cents%100)
	fmt.Fprintf(w, "%d duplicates acknowledged without charging\n", seen.count("billing/duplicate"))
	fmt.Fprintf(w, "receipts: %d payments relayed from the outbox, %d receipts\n",
		seen.count("receipts"), receipts)
	if charges != ordersPerRun || charged != ordersPerRun || receipts != ordersPerRun {
		return fmt.Errorf("%d charges and %d receipts for %d orders", charges, receipts, ordersPerRun)
	}
	_, err = fmt.Fprintln(w, "every order charged exactly once, one receipt per payment")
	return err
}

// deliveries is a middleware.Observer counting the inbox's outcomes per
// handler ("billing") and per handler and outcome ("billing/duplicate").
type deliveries struct {
	mu     sync.Mutex
	counts map[string]int
}

func (d *deliveries) ObserveDelivery(_ context.Context, x middleware.Delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts[x.Consumer]++
	d.counts[x.Consumer+"/"+string(x.Outcome)]++
}

func (d *deliveries) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts[key]
}
