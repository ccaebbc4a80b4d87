// Command router is a billing service with the inbox added to its
// Watermill router: each order is charged once, however often the broker
// delivers it.
//
//	POSTGRES_DSN=postgres://user@host:5432/db go run ./examples/router
//
// GoChannel stands in for your broker (watermill-amqp, watermill-kafka, …).
// The demo in demo.go sends three orders, re-sends one, and prints what
// the service charged.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

func main() {
	dsn := cmp.Or(os.Getenv("POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// Warnings and errors: Watermill logs each handler's start at INFO.
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	// Persistent: orders sent before the router subscribes wait for it.
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer pubSub.Close()
	if err := demo(ctx, dsn, pubSub, logger, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// run consumes "orders" until ctx ends.
func run(ctx context.Context, dsn string, pub message.Publisher, sub message.Subscriber, logger watermill.LoggerAdapter) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	repo, err := postgres.NewRepository(db, postgres.Config{})
	if err != nil {
		return err
	}
	// Or apply repository/postgres/migrations/inbox with your migration tool.
	if err := repo.Migrate(ctx); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (order_id TEXT NOT NULL, cents BIGINT NOT NULL)`); err != nil {
		return err
	}

	// One inbox for the whole router: keys are scoped by this service's
	// name and the handler's ("shop/billing"), so neither handlers sharing
	// a topic nor services sharing the table suppress each other.
	inbox, err := middleware.NewInbox(repo, middleware.Config{
		Consumer:         "shop",         // required: this service's name
		RedeliveryWindow: 24 * time.Hour, // retention (default 7 days) must cover it
		Logger:           logger,
	})
	if err != nil {
		return err
	}
	// Deletes records whose retention is over, while the router runs.
	cleaner, err := janitor.NewJanitor(repo, janitor.Config{Logger: logger})
	if err != nil {
		return err
	}
	defer cleaner.Close()

	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	// Messages that can never succeed go to a poison queue: permanent inbox
	// errors (no key, key reused for other content) and malformed orders.
	poison, err := wmiddleware.PoisonQueueWithFilter(pub, "orders.poison", func(err error) bool {
		return idempotency.IsPermanent(err) || errors.Is(err, errMalformed)
	})
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, inbox.Middleware)
	router.AddPlugin(cleaner.RouterPlugin())
	router.AddHandler("billing", "orders", sub, "payments", pub, charge)
	return router.Run(ctx)
}

var errMalformed = errors.New("malformed order")

type order struct {
	ID    string `json:"id"`
	Cents int64  `json:"cents"`
}

// charge runs inside the inbox transaction: the charge commits together
// with the "processed" marker, or neither does and the broker redelivers.
func charge(msg *message.Message) ([]*message.Message, error) {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, fmt.Errorf("%w: %w", errMalformed, err)
	}
	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(msg.Context(), `INSERT INTO charges (order_id, cents) VALUES ($1, $2)`, o.ID, o.Cents); err != nil {
		return nil, err // rolls back the charge and the marker: the retry is safe
	}
	// Stored with the marker: a duplicate delivery gets it again, same UUID.
	return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
}
