package outbox_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// A producer writes an order and its event in one transaction; a relay
// forwards the event to the broker. (Compiled, not run: it needs a
// PostgreSQL server; the package tests run the same flow.)
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL})
	if err != nil {
		log.Fatal(err)
	}
	if err := ob.Migrate(ctx, db); err != nil { // once, at deploy time
		log.Fatal(err)
	}

	// The business row and the event commit together or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ($1)`, "o-1"); err != nil {
		log.Fatal(err)
	}
	event := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"o-1"}`))
	if err := ob.InTx(tx).Publish("orders.placed", event); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The relay, usually in its own goroutine or process, forwards to any
	// Watermill publisher (AMQP, Kafka, …).
	var broker message.Publisher // e.g. amqp.NewPublisher(…)
	relay, err := outbox.NewRelay(db, broker, outbox.RelayConfig{
		Dialect:  sqldialect.PostgreSQL,
		Notifier: pgxoutbox.Notifier(db), // wake on commit (LISTEN/NOTIFY)
	})
	if err != nil {
		log.Fatal(err)
	}
	defer relay.Close()
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
