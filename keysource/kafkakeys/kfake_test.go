package kafkakeys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/keysourcetest"
	"github.com/idemkit/watermill-idempotent/keysource/kafkakeys"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// saramaVersion is the newest protocol version the in-process kfake
// broker understands from Sarama's consumer group (see
// examples/internal/e2e/broker/kafka.go).
var saramaVersion = sarama.V2_3_0_0

// partitions of every test topic.
const partitions = 3

// cluster is an in-process Kafka (kfake) with an orders topic and its
// poison topic, a franz-go client producing to it the way a service that
// is not Watermill does, and Watermill's poison publisher.
type cluster struct {
	brokers        []string
	orders, poison string
	producer       *kgo.Client
	poisonPub      *kafka.Publisher
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{orders: backends.RandomName("orders")}
	c.poison = c.orders + "_poison"
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0), kfake.SeedTopics(partitions, c.orders, c.poison))
	require.NoError(t, err)
	t.Cleanup(kf.Close)
	c.brokers = kf.ListenAddrs()

	// Records name their partition, so a test can put the copies of one
	// order on different partitions.
	c.producer, err = kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(c.producer.Close)

	sc := kafka.DefaultSaramaSyncPublisherConfig()
	sc.Version = saramaVersion
	c.poisonPub, err = kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: c.brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.poisonPub.Close()) })
	return c
}

// produce sends records to the orders topic and waits for the broker.
func (c *cluster) produce(t *testing.T, records ...*kgo.Record) {
	t.Helper()
	for _, r := range records {
		r.Topic = c.orders
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.producer.ProduceSync(ctx, records...).FirstErr())
}

// consumer starts the README wiring on SQLite, consuming the orders
// topic with unmarshaler.
func (c *cluster) consumer(t *testing.T, unmarshaler kafka.Unmarshaler, key middleware.KeyFunc) *keysourcetest.Consumer {
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Version = saramaVersion
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               c.brokers,
		Unmarshaler:           unmarshaler,
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         backends.RandomName("billing"),
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   250 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return keysourcetest.Start(t, keysourcetest.Config{
		Store:       backends.Open(t, "sqlite"),
		Topic:       c.orders,
		Subscriber:  sub,
		PoisonTopic: c.poison,
		Poison:      c.poisonPub,
		Key:         key,
	})
}

func header(key, value string) kgo.RecordHeader {
	return kgo.RecordHeader{Key: key, Value: []byte(value)}
}

// headerRecord is order i as a plain producer sends it: its own message
// id in a header, the order id as the record key, no Watermill header.
func headerRecord(i int) (string, *kgo.Record) {
	o := keysourcetest.Order{ID: fmt.Sprintf("order-%d", i), Cents: int64(100 * i)}
	return o.ID, &kgo.Record{
		Key:     []byte(o.ID),
		Value:   o.Payload(),
		Headers: []kgo.RecordHeader{header("message_id", "msg-"+o.ID), header("tenant", "acme")},
	}
}

// cloudEvent is order i as a binary-mode CloudEvent, per the CloudEvents
// Kafka protocol binding: attributes in ce_ headers, the data content
// type in content-type, the data as the value. Orders come from two
// sources that number their events independently, so the ids repeat
// across sources: only source+id identifies an event.
func cloudEvent(i int) (string, *kgo.Record) {
	o := keysourcetest.Order{ID: fmt.Sprintf("order-%d", i), Cents: int64(100 * i)}
	source := []string{"/shop/eu", "/shop/us"}[i%2]
	return o.ID, &kgo.Record{
		Key:   []byte(o.ID),
		Value: o.Payload(),
		Headers: []kgo.RecordHeader{
			header("ce_specversion", "1.0"),
			header("ce_id", fmt.Sprintf("evt-%d", i/2)),
			header("ce_source", source),
			header("ce_type", "shop.order.placed"),
			header("ce_time", "2026-12-01T02:41:10Z"),
			header("content-type", "application/json"),
		},
	}
}

// TestRawProducerOncePerOrder: a franz-go producer sends each order twice
// (two separate produce calls, as an application retry does; kgo's
// idempotent producer only dedupes its own internal retries) without a
// Watermill header, the second copy on another partition, so the two
// copies are consumed concurrently; the README wiring on kfake and SQLite
// runs the handler exactly once per order.
func TestRawProducerOncePerOrder(t *testing.T) {
	const orders = 20
	for name, tc := range map[string]struct {
		record      func(i int) (string, *kgo.Record)
		unmarshaler kafka.Unmarshaler
		key         middleware.KeyFunc
		wantUUID    string // of order-3
	}{
		"KeyHeader": {headerRecord, kafkakeys.Unmarshaler{KeyHeader: "message_id"}, nil, "msg-order-3"},
		// DefaultMarshaler copies headers into metadata: MetadataKey
		// needs no wrapper, but the UUID (logs, outputs) stays empty.
		"MetadataKey DefaultMarshaler": {headerRecord, kafka.DefaultMarshaler{},
			middleware.MetadataKey("message_id"), ""},
		"CloudEvents binary": {cloudEvent, kafkakeys.Unmarshaler{}, nil, "8:/shop/us:evt-1"},
		// CloudEventsKey reads the ce_ headers DefaultMarshaler copies:
		// no wrapper needed when the KeyFunc is set.
		"CloudEventsKey DefaultMarshaler": {cloudEvent, kafka.DefaultMarshaler{}, middleware.CloudEventsKey, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			var ids []string
			for attempt := 1; attempt <= 2; attempt++ {
				for i := range orders {
					id, r := tc.record(i)
					if attempt == 1 {
						ids = append(ids, id)
					}
					r.Partition = int32((i + attempt) % partitions)
					c.produce(t, r)
				}
			}
			con := c.consumer(t, tc.unmarshaler, tc.key)
			con.WaitAcked(t, 2*orders)
			con.RequireOncePerOrder(t, ids)
			require.Equal(t, tc.wantUUID, con.Last("order-3").UUID)
		})
	}
}

// TestRawProducerWithoutKey: a record without the key header (and not a
// CloudEvent) has no key. The inbox fails it with the permanent ErrNoKey,
// the poison topic receives it with the reason, its offset is committed
// like any handled record, and the keyed orders around it run once each.
func TestRawProducerWithoutKey(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	_, keyed1 := headerRecord(1)
	_, keyless := headerRecord(2)
	keyless.Headers = keyless.Headers[1:] // tenant only
	_, keyed3 := headerRecord(3)
	_, again1 := headerRecord(1)
	c.produce(t, keyed1, keyless, keyed3, again1)
	con := c.consumer(t, kafkakeys.Unmarshaler{KeyHeader: "message_id"}, nil)
	con.WaitAcked(t, 4)
	con.RequireOncePerOrder(t, []string{"order-1", "order-3"})

	reader, err := kgo.NewClient(kgo.SeedBrokers(c.brokers...), kgo.ConsumeTopics(c.poison))
	require.NoError(t, err)
	defer reader.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var poisoned []*kgo.Record
	for len(poisoned) == 0 {
		fetches := reader.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "nothing in the poison topic")
		require.Empty(t, fetches.Errors())
		poisoned = append(poisoned, fetches.Records()...)
	}
	require.Len(t, poisoned, 1)
	require.Equal(t, keyless.Value, poisoned[0].Value)
	headers := map[string]string{}
	for _, h := range poisoned[0].Headers {
		headers[h.Key] = string(h.Value)
	}
	require.Contains(t, headers[wmiddleware.ReasonForPoisonedKey], idempotency.ErrNoKey.Error())
	require.Contains(t, headers[wmiddleware.ReasonForPoisonedKey], "UUID is empty")
	require.Equal(t, "acme", headers["tenant"])
}
