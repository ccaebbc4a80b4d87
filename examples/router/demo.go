package main

// The demo, which a real service does not need: a producer that re-sends
// an order with the same UUID, and the charges read back from the database.

import (
	"context"
	"database/sql"
	"fmt"
	"io"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// demo runs the service on pubSub, sends it three orders and order-2 again
// with the same UUID, as a producer does when a publish confirmation is
// lost, waits for their payments, stops the service and prints the
// charges. The UUIDs are fixed: run it again and nothing more is charged.
func demo(ctx context.Context, dsn string, pubSub *gochannel.GoChannel, logger watermill.LoggerAdapter, w io.Writer) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	payments, err := pubSub.Subscribe(ctx, "payments")
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, dsn, pubSub, pubSub, logger) }()

	sent := []struct{ uuid, order string }{
		{"00000000-0000-4000-8000-000000000001", `{"id":"order-1","cents":1200}`},
		{"00000000-0000-4000-8000-000000000002", `{"id":"order-2","cents":550}`},
		{"00000000-0000-4000-8000-000000000003", `{"id":"order-3","cents":9900}`},
		{"00000000-0000-4000-8000-000000000002", `{"id":"order-2","cents":550}`}, // re-sent
	}
	for _, m := range sent {
		if err := pubSub.Publish("orders", message.NewMessage(m.uuid, []byte(m.order))); err != nil {
			return err
		}
		fmt.Fprintf(w, "sent     %s %s\n", m.uuid, m.order)
	}
	// One payment per delivery: a duplicate's is the stored one, same UUID.
	for range sent {
		select {
		case p := <-payments:
			p.Ack()
			fmt.Fprintf(w, "payment  %s %s\n", p.UUID, p.Payload)
		case err := <-done:
			return fmt.Errorf("the service stopped: %w", err)
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	return printCharges(context.WithoutCancel(ctx), dsn, w)
}

// printCharges prints the demo's rows of the charges table: one per order,
// however many times it was delivered (a double charge would print twice).
func printCharges(ctx context.Context, dsn string, w io.Writer) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT order_id, cents FROM charges
		WHERE order_id IN ('order-1', 'order-2', 'order-3') ORDER BY order_id`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var cents int64
		if err := rows.Scan(&id, &cents); err != nil {
			return err
		}
		fmt.Fprintf(w, "charged  %s $%d.%02d\n", id, cents/100, cents%100)
	}
	return rows.Err()
}
