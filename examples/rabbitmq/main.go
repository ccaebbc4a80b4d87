// Command rabbitmq is an orders → payments service on RabbitMQ whose
// consumers run behind the inbox, with payment events leaving through the
// transactional outbox, all on PostgreSQL. Copy it into a service.
//
//	docker compose -f examples/rabbitmq/docker-compose.yml up -d   # or your own servers
//	go run ./examples/rabbitmq
//
// The producer publishes every order and re-sends every third one with the
// same UUID, as a producer does when a publish confirmation is lost.
// Billing charges an order in the inbox transaction, so the charge, the
// "processed" marker and the PaymentCompleted event (in the outbox) commit
// together; the relay publishes the event; receipts records one receipt
// per payment. The ledger at the end shows every order charged once.
//
// Competing instances, crashes before the ack, poison messages and the
// other brokers are exercised by examples/internal/e2e.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

type config struct {
	AMQPURL, PostgresDSN string
	Orders               int
	Prefix               string // of every table, exchange and queue
}

func main() {
	c := config{Prefix: "shop_"}
	flag.StringVar(&c.AMQPURL, "amqp-url", cmp.Or(os.Getenv("AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL (env AMQP_URL)")
	flag.StringVar(&c.PostgresDSN, "postgres-dsn", cmp.Or(os.Getenv("POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN (env POSTGRES_DSN)")
	flag.IntVar(&c.Orders, "orders", 12, "orders to place")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

type order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	Cents    int64  `json:"cents"`
}

func run(ctx context.Context, c config, w io.Writer) error {
	logger := watermill.NopLogger{}
	ordersTopic, paymentsTopic := c.Prefix+"orders", c.Prefix+"payments"
	charges, receipts := c.Prefix+"charges", c.Prefix+"receipts"

	db, err := sql.Open("pgx", c.PostgresDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	repo, err := postgres.NewRepository(db, postgres.Config{Table: c.Prefix + "inbox"})
	if err != nil {
		return err
	}
	ob, err := outbox.New(outbox.Config{Dialect: outbox.PostgreSQL, Table: c.Prefix + "outbox"})
	if err != nil {
		return err
	}
	if err := repo.Migrate(ctx); err != nil { // or apply its migrations with your tool
		return err
	}
	if err := ob.Migrate(ctx, db); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+charges+` (order_id TEXT, customer TEXT, cents BIGINT);
		CREATE TABLE IF NOT EXISTS `+receipts+` (payment_uuid TEXT, payment TEXT)`); err != nil {
		return err
	}

	// Durable fanout exchange per topic, durable queue per topic and consumer.
	queue := func(consumer string) amqp.Config {
		return amqp.NewDurablePubSubConfig(c.AMQPURL, amqp.GenerateQueueNameTopicNameWithSuffix(consumer))
	}
	pub, err := amqp.NewPublisher(queue(""), logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	billingSub, err := amqp.NewSubscriber(queue("billing"), logger)
	if err != nil {
		return err
	}
	receiptsSub, err := amqp.NewSubscriber(queue("receipts"), logger)
	if err != nil {
		return err
	}

	// One inbox for the router: keys are scoped by handler name. Payments
	// go to the outbox inside the inbox transaction, not to the publisher.
	seen := &outcomes{n: map[string]int{}}
	inbox, err := middleware.NewInbox(middleware.Config{
		DB: db, Repository: repo, Outputs: ob.Outputs(paymentsTopic), Observer: seen, Logger: logger,
	})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: outbox.PostgreSQL, Table: c.Prefix + "outbox"}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	// Permanent inbox errors (no key, a key reused for other content) go to
	// the poison topic and are acknowledged; every other error is retried.
	poison, err := wmiddleware.PoisonQueueWithFilter(pub, c.Prefix+"orders_poison", middleware.IsPermanent)
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, inbox.Middleware)
	router.AddHandler("billing", ordersTopic, billingSub, paymentsTopic, pub, func(msg *message.Message) ([]*message.Message, error) {
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return nil, err
		}
		tx, _ := middleware.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+charges+` VALUES ($1, $2, $3)`, o.ID, o.Customer, o.Cents); err != nil {
			return nil, err // rolls back charge and marker: the redelivery charges again
		}
		scope, _ := middleware.ScopeFromContext(msg.Context())
		key, _ := middleware.KeyFromContext(msg.Context())
		return []*message.Message{message.NewMessage(middleware.OutputUUID(scope, key, 0), msg.Payload)}, nil
	})
	router.AddConsumerHandler("receipts", paymentsTopic, receiptsSub, func(msg *message.Message) error {
		tx, _ := middleware.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+receipts+` VALUES ($1, $2)`, msg.UUID, string(msg.Payload))
		return err
	})

	ctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }() // after stop: the relay and the router end with ctx
	wg.Go(func() { _ = relay.Run(ctx) })
	wg.Go(func() { _ = router.Run(ctx) })
	<-router.Running()

	// The producer: a third of the orders re-sent with the same UUID.
	runID := watermill.NewShortUUID()[:8] // in every order ID: the ledger reads this run's rows
	published := 0
	for i := range c.Orders {
		o := order{ID: fmt.Sprintf("%s-%03d", runID, i+1), Customer: []string{"alice", "bob", "carol"}[i%3], Cents: int64(100 + i*250)}
		payload, _ := json.Marshal(o)
		msg := message.NewMessage(watermill.NewUUID(), payload)
		for range 1 + (i%3)/2 {
			if err := pub.Publish(ordersTopic, msg.Copy()); err != nil {
				return err
			}
			published++
		}
	}
	for seen.get("billing") < published || seen.get("receipts") < c.Orders {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the orders: %w (%d billing and %d receipts deliveries)", ctx.Err(), seen.get("billing"), seen.get("receipts"))
		case <-time.After(20 * time.Millisecond):
		}
	}

	// The ledger, from the database.
	var charged, chargedOrders, cents, receiptCount int
	err = db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT order_id), COALESCE(SUM(cents), 0), (SELECT COUNT(*) FROM `+receipts+
		` WHERE payment LIKE '%"'||$1||'-%') FROM `+charges+` WHERE order_id LIKE $1||'-%'`, runID).Scan(&charged, &chargedOrders, &cents, &receiptCount)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "run %s: %d orders published as %d messages (%d re-sent with the same UUID)\n", runID, c.Orders, published, published-c.Orders)
	fmt.Fprintf(w, "billing:  %d charges for %d orders, $%d.%02d; %d duplicates acknowledged without charging\n",
		charged, chargedOrders, cents/100, cents%100, seen.get("billing/duplicate"))
	fmt.Fprintf(w, "receipts: %d payments relayed from the outbox, %d receipts\n", seen.get("receipts"), receiptCount)
	if charged != c.Orders || chargedOrders != c.Orders || receiptCount != c.Orders {
		return fmt.Errorf("%d charges and %d receipts for %d orders", charged, receiptCount, c.Orders)
	}
	_, err = fmt.Fprintln(w, "every order charged exactly once, one receipt per payment")
	return err
}

// outcomes counts the inbox's outcomes per handler ("billing/duplicate").
type outcomes struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *outcomes) ObserveDelivery(_ context.Context, d middleware.Delivery) {
	o.mu.Lock()
	o.n[d.Consumer+"/"+string(d.Outcome)]++
	o.n[d.Consumer]++
	o.mu.Unlock()
}

func (o *outcomes) get(k string) int { o.mu.Lock(); defer o.mu.Unlock(); return o.n[k] }
