package amqpkeys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/keysourcetest"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/keysource/amqpkeys"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// rabbit is a raw amqp091-go producer — what a Java or Python service
// does — on two fresh durable queues, and the watermill-amqp subscriber
// and poison publisher a Watermill consumer of them configures with
// amqpkeys.Marshaler.
type rabbit struct {
	ch            *amqp091.Channel
	queue, poison string
	sub           message.Subscriber
	pub           message.Publisher
}

func newRabbit(t *testing.T) *rabbit {
	url := testenv.AMQP(t)
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	r := &rabbit{ch: ch, queue: backends.RandomName("amqpkeys_orders")}
	r.poison = r.queue + "_poison"
	for _, q := range []string{r.queue, r.poison} {
		// The arguments of watermill-amqp's durable queue config, so both
		// sides may declare it.
		_, err := ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, q := range []string{r.queue, r.poison} {
			_, err := ch.QueueDelete(q, false, false, false)
			require.NoError(t, err)
		}
	})

	config := amqp.NewDurableQueueConfig(url)
	config.Marshaler = amqpkeys.Marshaler{} // the one line this package is for
	config.Publish.ConfirmDelivery = true
	r.sub, err = amqp.NewSubscriber(config, watermill.NopLogger{})
	require.NoError(t, err)
	r.pub, err = amqp.NewPublisher(config, watermill.NopLogger{})
	require.NoError(t, err)
	// Registered after the queue cleanup, so they close first.
	t.Cleanup(func() {
		require.NoError(t, r.sub.Close())
		require.NoError(t, r.pub.Close())
	})
	return r
}

// publish sends p to the orders queue the way a plain AMQP client does
// and waits for the broker's confirmation.
func (r *rabbit) publish(t *testing.T, p amqp091.Publishing) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	confirm, err := r.ch.PublishWithDeferredConfirmWithContext(ctx, "", r.queue, true, false, p)
	require.NoError(t, err)
	ok, err := confirm.WaitContext(ctx)
	require.NoError(t, err)
	require.True(t, ok, "broker nacked the publish")
}

func (r *rabbit) consumer(t *testing.T, key middleware.KeyFunc) *keysourcetest.Consumer {
	return keysourcetest.Start(t, keysourcetest.Config{
		Store:       backends.Open(t, "postgres"),
		Topic:       r.queue,
		Subscriber:  r.sub,
		PoisonTopic: r.poison,
		Poison:      r.pub,
		Key:         key,
	})
}

// order is the Publishing a non-Watermill producer sends for order i on
// its attempt'th try: the same message_id and body every time; the
// header it counts attempts in differs, and is an integer, which
// watermill-amqp's DefaultMarshaler refuses.
func order(i, attempt int, sentAt time.Time) (string, amqp091.Publishing) {
	o := keysourcetest.Order{ID: fmt.Sprintf("order-%d", i), Cents: int64(100 * i)}
	return o.ID, amqp091.Publishing{
		MessageId:     "msg-" + o.ID,
		CorrelationId: "checkout-" + o.ID,
		Type:          "shop.order.placed",
		AppId:         "java-shop",
		ContentType:   "application/json",
		Timestamp:     sentAt,
		DeliveryMode:  amqp091.Persistent,
		Headers:       amqp091.Table{"x-attempt": int32(attempt), "tenant": "acme"},
		Body:          o.Payload(),
	}
}

// TestRawProducerOncePerOrder: a plain amqp091-go producer publishes each
// order twice with message_id set and no Watermill header; the README
// wiring on RabbitMQ and PostgreSQL with amqpkeys.Marshaler runs the
// handler exactly once per order, keyed by message_id through the default
// UUIDKey or through MetadataKey(amqpkeys.MessageID). The handler sees the
// AMQP properties in metadata.
func TestRawProducerOncePerOrder(t *testing.T) {
	const orders = 20
	for name, key := range map[string]middleware.KeyFunc{
		"UUIDKey":     nil, // the inbox's default
		"MetadataKey": middleware.MetadataKey(amqpkeys.MessageID),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := newRabbit(t)
			sentAt := time.Date(2026, 12, 1, 2, 41, 10, 0, time.UTC)
			var ids []string
			for attempt := 1; attempt <= 2; attempt++ {
				for i := range orders {
					id, p := order(i, attempt, sentAt)
					if attempt == 1 {
						ids = append(ids, id)
					}
					r.publish(t, p)
				}
			}
			c := r.consumer(t, key)
			c.WaitAcked(t, 2*orders)
			c.RequireOncePerOrder(t, ids)

			msg := c.Last("order-3")
			require.Equal(t, "msg-order-3", msg.UUID)
			for field, want := range map[string]string{
				amqpkeys.MessageID:     "msg-order-3",
				amqpkeys.CorrelationID: "checkout-order-3",
				amqpkeys.Type:          "shop.order.placed",
				amqpkeys.AppID:         "java-shop",
				amqpkeys.ContentType:   "application/json",
				amqpkeys.Timestamp:     "2026-12-01T02:41:10Z",
				"tenant":               "acme",
			} {
				require.Equal(t, want, msg.Metadata.Get(field), field)
			}
			require.Contains(t, []string{"1", "2"}, msg.Metadata.Get("x-attempt"))
			require.Equal(t, "checkout-order-3", wmiddleware.MessageCorrelationID(msg))
		})
	}
}

// TestRawProducerWithoutMessageID: a message with neither message_id nor
// the Watermill header has no key. The inbox fails it with the permanent
// ErrNoKey, the poison queue takes it (body and properties intact, the
// reason naming the missing key) and acknowledges it: the handler never
// runs for it, it is not requeued, and the keyed orders around it are
// processed once each.
func TestRawProducerWithoutMessageID(t *testing.T) {
	t.Parallel()
	r := newRabbit(t)
	now := time.Now()
	_, keyed1 := order(1, 1, now)
	_, keyless := order(2, 1, now)
	keyless.MessageId = ""
	_, keyed3 := order(3, 1, now)
	for _, p := range []amqp091.Publishing{keyed1, keyless, keyed3, keyed1} {
		r.publish(t, p)
	}
	c := r.consumer(t, nil)
	c.WaitAcked(t, 4)
	c.RequireOncePerOrder(t, []string{"order-1", "order-3"})

	got, ok, err := r.ch.Get(r.poison, true)
	require.NoError(t, err)
	require.True(t, ok, "the keyless message is not in the poison queue")
	require.Equal(t, keyless.Body, got.Body)
	require.Equal(t, "checkout-order-2", got.CorrelationId)
	require.Empty(t, got.MessageId)
	require.Contains(t, got.Headers[wmiddleware.ReasonForPoisonedKey], idempotency.ErrNoKey.Error())
	require.Contains(t, got.Headers[wmiddleware.ReasonForPoisonedKey], "UUID is empty")
	require.Equal(t, r.queue, got.Headers[wmiddleware.PoisonedTopicKey])
	_, ok, err = r.ch.Get(r.poison, true)
	require.NoError(t, err)
	require.False(t, ok, "more than one message in the poison queue")

	// Nothing left to redeliver: the orders queue is empty and has no
	// unacknowledged delivery once the subscriber lets go of it.
	require.NoError(t, r.sub.Close())
	q, err := r.ch.QueueDeclarePassive(r.queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.Zero(t, q.Messages, "messages left in the orders queue")
}
