package pgxoutbox_test

import (
	"context"
	"log"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Inbox, outbox and relay on one pgx pool: the handler's writes, the
// deduplication marker and the output messages commit in one pgx.Tx; the
// relay publishes the outputs, woken by NOTIFY on a native connection.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL})
	if err != nil {
		log.Fatal(err)
	}
	// Once, at deploy time.
	if err := repo.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := pgxoutbox.Migrate(ctx, ob, pool); err != nil {
		log.Fatal(err)
	}

	inbox, err := middleware.NewInbox(repo, middleware.Config{
		Consumer: "shipping",
		Outputs:  pgxoutbox.Outputs(ob, "orders.shipped"),
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, err := idempotency.Tx[pgx.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(msg.Context(), `UPDATE orders SET shipped = true WHERE id = $1`, string(msg.Payload)); err != nil {
			return nil, err
		}
		// Returned messages go to the outbox in tx; pgxoutbox.WriteTx
		// writes to other topics in it too.
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})

	var broker message.Publisher // e.g. amqp.NewPublisher(…)
	relay, err := pgxoutbox.NewRelay(pool, broker, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL})
	if err != nil {
		log.Fatal(err)
	}
	defer relay.Close()
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
