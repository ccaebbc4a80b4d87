package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Watermill's universal Pub/Sub test suite (pubsub/tests.TestPubSub) run
// on the outbox and its relay: the suite's publisher writes every Publish
// call into the outbox table in a transaction of its own
// (Outbox.InTx + Commit), a Relay forwards the table to a real broker, and
// the suite consumes that broker's subscriber. So the suite checks, end to
// end, that what is published into the outbox arrives with its UUID,
// payload and metadata, none lost, in order where the features say so.
//
// Each configuration has its own outbox table and one relay running for
// all of its sub-tests; the suite gives every sub-test its own topics.
//
// Sub-tests that run (the rest skip themselves, saying why, from the
// features): PublishSubscribe, ConcurrentSubscribe,
// ConcurrentSubscribeMultipleTopics, ResendOnError, ContinueAfterErrors,
// ConcurrentClose, PublisherClose, Topic, MessageCtx, SubscribeCtx; with
// GuaranteedOrder also PublishSubscribeInOrder and NoAck; with Persistent
// also ContinueAfterSubscribeClose; with NewSubscriberReceivesOldMessages
// (GoChannel) that test. Always skipped: ConsumerGroups and Reconnect (see
// the features). The suite's full message counts are used, except under
// -race (Features.ForceShort, logged).

// outboxPublisher is the suite's publisher: each Publish call writes its
// messages into the outbox in its own transaction, through the publisher
// Outbox.InTx returns (watermill-sql's Publisher over the *sql.Tx).
//
// It stays in the tests: a publisher that commits on its own gives up
// what an outbox is for (the messages commit with the business data in
// one transaction), and the same takes three lines with InTx.
type outboxPublisher struct {
	db     *sql.DB
	outbox *outbox.Outbox

	mu     sync.RWMutex
	closed bool
}

func (p *outboxPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errors.New("outbox publisher: closed")
	}
	ctx := context.Background()
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := p.outbox.InTx(tx).Publish(topic, msgs...); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Close waits for Publish calls in progress; later ones fail.
func (p *outboxPublisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// pubSubSuite is one configuration: an outbox table in db, a relay
// forwarding it to a broker, and a constructor of that broker's
// subscribers.
type pubSubSuite struct {
	db     *sql.DB
	outbox *outbox.Outbox
	newSub func(t *testing.T) message.Subscriber
}

// constructor is the suite's PubSubConstructor. Every subscriber is also
// closed when the sub-test ends: TestPublishSubscribeInOrder defers
// require.NoError(t, sub.Close()), which closes its subscriber before
// subscribing, so without this the subscriber would outlive the test
// (and goleak would report it).
func (s *pubSubSuite) constructor(t *testing.T) (message.Publisher, message.Subscriber) {
	sub := s.newSub(t)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return &outboxPublisher{db: s.db, outbox: s.outbox}, sub
}

// startSuiteRelay creates a fresh outbox table in db and runs a relay from
// it to broker until t ends.
func startSuiteRelay(t *testing.T, db *sql.DB, dialect sqldialect.Dialect, broker message.Publisher, cfg outbox.RelayConfig) *outbox.Outbox {
	t.Helper()
	table := "outbox_pubsub_" + randomSuffix()
	ob, err := outbox.New(outbox.Config{Dialect: dialect, Table: table})
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(context.Background(), db))
	t.Cleanup(backend{db: db, dialect: dialect, table: table}.drop)
	cfg.Dialect, cfg.Table, cfg.Logger = dialect, table, testLogger(t)
	relay, err := outbox.NewRelay(db, broker, cfg)
	require.NoError(t, err)
	runRelay(t, relay)
	return ob
}

// TestPubSub/postgres-amqp: PostgreSQL outbox (database/sql, pgx stdlib
// driver, LISTEN/NOTIFY wake-up) → relay → RabbitMQ with watermill-amqp's
// durable queue configuration (one durable queue per topic, consumers of
// a topic compete).
//
// TestPubSub/mariadb-amqp: the same on MariaDB (polling relay, the
// MySQL claim path).
//
// TestPubSub/sqlite-gochannel: SQLite outbox (polling relay) → relay → one
// GoChannel (Persistent: it keeps every message and replays it to later
// subscribers, as a broker's retention would); each constructed
// subscriber is a handle of its own on it, so closing one does not close
// the broker the relay publishes to.
func TestPubSub(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: Watermill's Pub/Sub suite publishes and consumes tens of thousands of messages")
	}
	t.Run("postgres-amqp", func(t *testing.T) {
		t.Parallel()
		url := testenv.AMQP(t)
		db := testenv.Postgres(t)
		testPubSubAMQP(t, url, db, sqldialect.PostgreSQL, outbox.RelayConfig{Notifier: pgxoutbox.Notifier(db)})
	})
	t.Run("mariadb-amqp", func(t *testing.T) {
		t.Parallel()
		url := testenv.AMQP(t)
		db := testenv.MySQL(t)
		testPubSubAMQP(t, url, db, sqldialect.MySQL, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})
	})
	t.Run("sqlite-gochannel", func(t *testing.T) {
		t.Parallel()
		db := testenv.SQLite(t)
		broker := gochannel.NewGoChannel(gochannel.Config{
			OutputChannelBuffer: 10000,
			Persistent:          true,
		}, watermill.NopLogger{})
		t.Cleanup(func() { require.NoError(t, broker.Close()) })
		ob := startSuiteRelay(t, db, sqldialect.SQLite, broker, outbox.RelayConfig{
			PollInterval:  20 * time.Millisecond,
			RetryInterval: 50 * time.Millisecond,
		})
		s := &pubSubSuite{db: db, outbox: ob, newSub: func(*testing.T) message.Subscriber {
			return newSubscriberHandle(broker)
		}}
		tests.TestPubSub(t, tests.Features{
			// Under -race SQLite is many times slower (PublisherClose's
			// 10,000 transactions alone took 72 s): the suite then runs
			// its short message counts, the same checks on fewer messages.
			ForceShort: forceShort(t),
			// GoChannel has no consumer groups: every subscriber of a
			// topic gets every message.
			ConsumerGroups: false,
			// The relay delivers at least once.
			ExactlyOnceDelivery: false,
			// GoChannel hands each message to its subscribers on a
			// goroutine of its own and Publish does not wait, so the
			// broker does not keep the relay's order.
			GuaranteedOrder: false,
			// GoChannel lives in this process only.
			Persistent: false,
			// GoChannel broadcasts: several subscribers would each get
			// every message, as with GoChannel's own suite.
			RequireSingleInstance: true,
			// Persistent: GoChannel keeps every message and replays
			// it to each new subscriber of its topic.
			NewSubscriberReceivesOldMessages: true,
			ContextPreserved:                 false,
		}, s.constructor, nil)
	})
}

// testPubSubAMQP runs the suite on an outbox in db relayed to RabbitMQ
// at url (durable queue configuration).
func testPubSubAMQP(t *testing.T, url string, db *sql.DB, dialect sqldialect.Dialect, relayConfig outbox.RelayConfig) {
	logger := testLogger(t)
	queues := newQueueSet(t, url)
	broker, err := amqp.NewPublisher(amqp.NewDurableQueueConfig(url), logger)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, broker.Close()) })
	relayConfig.RetryInterval = 50 * time.Millisecond
	ob := startSuiteRelay(t, db, dialect, broker, relayConfig)
	s := &pubSubSuite{db: db, outbox: ob, newSub: func(t *testing.T) message.Subscriber {
		sub, err := amqp.NewSubscriber(amqp.NewDurableQueueConfig(url), logger)
		require.NoError(t, err)
		return queues.track(sub)
	}}
	tests.TestPubSub(t, tests.Features{
		// make test runs every package under -race at once: the suite's
		// short counts keep this package inside its timeout there; the
		// full counts run without -race.
		ForceShort: forceShort(t),
		// Queue config: the subscribers of a topic share its queue.
		ConsumerGroups: false,
		// The relay and RabbitMQ both deliver at least once.
		ExactlyOnceDelivery: false,
		// One relay publishes in id order (a transaction's messages
		// in insertion order, sequential transactions in commit
		// order) over one AMQP publisher; a queue keeps that order
		// for one consumer. Not with several relays (docs/outbox.md).
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		// Rows stay in the table until published; queues are durable.
		Persistent: true,
		// A queue's messages go to one consumer and are gone once
		// acked.
		NewSubscriberReceivesOldMessages: false,
		// Restarting the shared RabbitMQ would disturb other tests:
		// TestReconnect is skipped.
		RestartServiceCommand: nil,
		// The relay publishes messages read from the table: the
		// publisher's message context does not travel.
		ContextPreserved: false,
	}, s.constructor, nil)
}

// forceShort is the suite's Features.ForceShort: under -race (logged),
// its -short message counts.
func forceShort(t *testing.T) bool {
	if raceDetector {
		t.Log("race detector: Features.ForceShort (the suite's -short message counts)")
	}
	return raceDetector
}

// queueSet records the queues the suite's AMQP subscribers declare, and
// deletes them when the test ends.
type queueSet struct {
	mu     sync.Mutex
	queues map[string]struct{}
}

func newQueueSet(t *testing.T, url string) *queueSet {
	q := &queueSet{queues: map[string]struct{}{}}
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		require.NoError(t, err)
		defer func() { _ = conn.Close() }()
		ch, err := conn.Channel()
		require.NoError(t, err)
		q.mu.Lock()
		defer q.mu.Unlock()
		for name := range q.queues {
			_, err := ch.QueueDelete(name, false, false, false)
			require.NoError(t, err, "delete queue %s", name)
		}
	})
	return q
}

func (q *queueSet) add(topic string) {
	q.mu.Lock()
	q.queues[topic] = struct{}{} // queue config: the queue is named after the topic
	q.mu.Unlock()
}

// track wraps sub so its topics are recorded.
func (q *queueSet) track(sub *amqp.Subscriber) message.Subscriber {
	return &trackedSubscriber{Subscriber: sub, queues: q}
}

type trackedSubscriber struct {
	*amqp.Subscriber
	queues *queueSet
}

func (s *trackedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.queues.add(topic)
	return s.Subscriber.Subscribe(ctx, topic)
}

func (s *trackedSubscriber) SubscribeInitialize(topic string) error {
	s.queues.add(topic)
	return s.Subscriber.SubscribeInitialize(topic)
}

// subscriberHandle is one subscriber of a shared GoChannel: Close ends
// its own subscriptions (and returns once their channels are closed),
// not the GoChannel.
type subscriberHandle struct {
	broker *gochannel.GoChannel
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newSubscriberHandle(broker *gochannel.GoChannel) *subscriberHandle {
	ctx, cancel := context.WithCancel(context.Background())
	return &subscriberHandle{broker: broker, ctx: ctx, cancel: cancel}
}

func (h *subscriberHandle) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if h.ctx.Err() != nil {
		return nil, errors.New("subscriber closed")
	}
	subCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(h.ctx, cancel)
	in, err := h.broker.Subscribe(subCtx, topic)
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	out := make(chan *message.Message)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(out)
		defer cancel()
		defer stop()
		for msg := range in {
			select {
			case out <- msg:
			case <-subCtx.Done():
				// GoChannel stops waiting for the ack when the
				// subscription ends; drain until it closes in.
			}
		}
	}()
	return out, nil
}

func (h *subscriberHandle) Close() error {
	h.cancel()
	h.wg.Wait()
	return nil
}
