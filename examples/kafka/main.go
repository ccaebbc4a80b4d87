// Command kafka is an orders → payments service on Kafka (watermill-kafka
// v3, Sarama, consumer groups) whose consumers run behind the inbox, with
// payment events leaving through the transactional outbox, all on
// PostgreSQL. Copy it into a service.
//
//	go run ./examples/kafka                                # in-process Kafka (kfake.go) + PostgreSQL
//	KAFKA_BROKERS=127.0.0.1:9092 go run ./examples/kafka   # a real Kafka (docker-compose.yml here)
//
// Billing charges an order in the inbox transaction, so the charge, the
// "processed" marker and the PaymentCompleted event (in the outbox) commit
// together; the relay publishes the event; receipts records one receipt
// per payment. The demo (demo.go), which a service does not need, places
// orders, re-sending every third one with the same UUID as a producer does
// when a publish confirmation is lost, and prints a ledger showing every
// order charged once.
//
// Competing instances, crashes before the offset commit, poison messages
// and the other brokers are exercised by examples/internal/e2e.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"io"
	"log"
	"os"
	"os/signal"
	"sync"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

type config struct {
	KafkaBrokers string // comma-separated bootstrap addresses; none: start kfake
	PostgresDSN  string
}

func main() {
	c := config{KafkaBrokers: os.Getenv("KAFKA_BROKERS")}
	c.PostgresDSN = cmp.Or(os.Getenv("POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

type order struct {
	ID    string `json:"id"`
	Cents int64  `json:"cents"`
}

// run starts the service, then runs the demo against it.
func run(ctx context.Context, c config, w io.Writer) error {
	logger := watermill.NopLogger{}
	orders, payments := "orders", "payments"
	db, err := sql.Open("pgx", c.PostgresDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	// The inbox's and the outbox's tables (or apply their migrations with
	// your tool) and the service's own.
	repo, err := postgres.NewRepository(db, postgres.Config{})
	if err != nil {
		return err
	}
	if err := repo.Migrate(ctx); err != nil {
		return err
	}
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL})
	if err != nil {
		return err
	}
	if err := ob.Migrate(ctx, db); err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (order_id TEXT, cents BIGINT);
		CREATE TABLE IF NOT EXISTS receipts (payment_id TEXT, payment TEXT)`)
	if err != nil {
		return err
	}

	brokers, stopKafka, err := kafkaBrokers(c.KafkaBrokers)
	if err != nil {
		return err
	}
	defer stopKafka()
	if err := createTopics(brokers, saramaConfig(sarama.NewConfig()), orders, payments); err != nil {
		return err
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               brokers,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: idempotent(saramaConfig(kafka.DefaultSaramaSyncPublisherConfig())),
	}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	// A consumer group per handler. A new group starts at the oldest offset,
	// so it reads what was published before it joined.
	subscriber := func(group string) (*kafka.Subscriber, error) {
		sc := saramaConfig(kafka.DefaultSaramaSubscriberConfig())
		sc.Consumer.Offsets.Initial = sarama.OffsetOldest
		return kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               brokers,
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: sc,
			ConsumerGroup:         group,
		}, logger)
	}
	billingSub, err := subscriber("billing")
	if err != nil {
		return err
	}
	receiptsSub, err := subscriber("receipts")
	if err != nil {
		return err
	}

	// One inbox for the router: keys are scoped by this service's name and
	// the handler's ("shop/billing"). A handler's output goes to the outbox
	// inside the inbox transaction, not to the publisher; the relay
	// publishes it.
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Outputs: ob.Outputs(payments), Logger: logger})
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, Logger: logger})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	// Permanent inbox errors (no key, a key reused for other content) go to
	// the poison topic and are acknowledged; every other error is retried.
	poison, err := wmiddleware.PoisonQueueWithFilter(pub, orders+"_poison", idempotency.IsPermanent)
	if err != nil {
		return err
	}
	acked := &acks{n: map[string]int{}} // for the demo
	router.AddMiddleware(acked.middleware, poison, inbox.Middleware)
	router.AddHandler("billing", orders, billingSub, payments, pub, bill)
	router.AddConsumerHandler("receipts", payments, receiptsSub, recordReceipt)

	ctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }() // after stop: the relay and the router end with ctx
	wg.Go(func() { _ = relay.Run(ctx) })
	wg.Go(func() { _ = router.Run(ctx) })
	<-router.Running()
	return placeOrders(ctx, w, db, pub, orders, acked)
}

// bill charges an order in the inbox transaction and returns the payment,
// which the inbox writes to the outbox in that transaction.
func bill(msg *message.Message) ([]*message.Message, error) {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, err
	}
	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
	if err != nil {
		return nil, err
	}
	_, err = tx.ExecContext(msg.Context(), `INSERT INTO charges (order_id, cents) VALUES ($1, $2)`,
		o.ID, o.Cents)
	if err != nil {
		return nil, err // rolls back the charge and the marker: the redelivery charges again
	}
	// The inbox gives the payment a UUID derived from the order's key: the
	// same on every attempt, so the receipts inbox sees one payment.
	return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
}

// recordReceipt records each payment once, in its own inbox transaction.
func recordReceipt(msg *message.Message) error {
	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(msg.Context(), `INSERT INTO receipts (payment_id, payment) VALUES ($1, $2)`,
		msg.UUID, string(msg.Payload))
	return err
}

// idempotent turns on Kafka's idempotent producer: the broker recognises
// a retried produce request (its answer was lost) by the producer id and
// sequence number and stores it once, so producer retries make no copies
// for the inbox to absorb. Sarama refuses it without acks from every
// in-sync replica, one request in flight and retries (docs/brokers.md).
func idempotent(sc *sarama.Config) *sarama.Config {
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Retry.Max = 10
	return sc
}
