// Package brokers opens the real brokers the bench harnesses publish to
// and consume from: RabbitMQ (watermill-amqp), NATS JetStream
// (watermill-nats) and Kafka (watermill-kafka over Sarama, against kfake
// in process).
package brokers

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaVersion is the newest protocol version Sarama can speak to kfake
// (see examples/internal/e2e/broker/kafka.go).
var KafkaVersion = sarama.V2_3_0_0

// StartKfake starts an in-process Kafka-protocol broker on a free port
// with topic created with the given number of partitions.
func StartKfake(topic string, partitions int) (*kfake.Cluster, error) {
	return kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0), kfake.SeedTopics(int32(partitions), topic))
}

// NewKafkaPublisher is a synchronous Sarama publisher.
func NewKafkaPublisher(brokers []string) (*kafka.Publisher, error) {
	sc := kafka.DefaultSaramaSyncPublisherConfig()
	sc.Version = KafkaVersion
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
}

// NewKafkaSubscriber joins consumer group group: each member owns whole
// partitions and handles one message per partition at a time.
func NewKafkaSubscriber(brokers []string, group string) (*kafka.Subscriber, error) {
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Version = KafkaVersion
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	sc.Consumer.Group.Rebalance.Retry.Backoff = 250 * time.Millisecond
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
		ConsumerGroup: group, NackResendSleep: 20 * time.Millisecond, ReconnectRetrySleep: 250 * time.Millisecond,
	}, watermill.NopLogger{})
}

// AMQPConfig is a competing-consumer queue: every subscriber of the
// topic consumes from the one durable queue named after it, each
// Subscribe on a channel of its own with prefetch unacknowledged
// deliveries.
func AMQPConfig(url string, prefetch int) amqp.Config {
	c := amqp.NewDurableQueueConfig(url)
	c.Consume.Qos.PrefetchCount = prefetch
	return c
}

// NewAMQPPublisher declares queue and returns a publisher to it. (The
// publisher sends to the default exchange, which drops messages for a
// queue that does not exist yet.)
func NewAMQPPublisher(url, queue string) (message.Publisher, error) {
	sub, err := amqp.NewSubscriber(AMQPConfig(url, 1), watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	err = sub.SubscribeInitialize(queue)
	_ = sub.Close()
	if err != nil {
		return nil, err
	}
	return amqp.NewPublisher(AMQPConfig(url, 1), watermill.NopLogger{})
}

// DeleteQueue deletes queue, if it can.
func DeleteQueue(url, queue string) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	if ch, err := conn.Channel(); err == nil {
		_, _ = ch.QueueDelete(queue, false, false, false)
	}
}

// NATSStream creates the JetStream work-queue stream topic (subject
// topic) and returns a function that deletes it.
func NATSStream(ctx context.Context, url, topic string) (func(), error) {
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("nats at %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: topic, Subjects: []string{topic}, Retention: jetstream.WorkQueuePolicy})
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: stream %s: %w", topic, err)
	}
	return func() {
		_ = js.DeleteStream(context.Background(), topic)
		nc.Close()
	}, nil
}

// NewNATSPublisher is watermill-nats's JetStream publisher.
func NewNATSPublisher(url string) (message.Publisher, error) {
	return wmjs.NewPublisher(wmjs.PublisherConfig{URL: url, Logger: watermill.NopLogger{}})
}

// NewNATSSubscriber subscribes to the durable consumer group on the
// topic's stream: every Subscribe pulls from it, competing for its
// messages, up to pull at a time, acknowledging each explicitly.
func NewNATSSubscriber(url, group string, pull int) (message.Subscriber, error) {
	return wmjs.NewSubscriber(wmjs.SubscriberConfig{
		URL:                 url,
		Logger:              watermill.NopLogger{},
		AckWaitTimeout:      30 * time.Second,
		ResourceInitializer: wmjs.GroupedConsumer(group),
		ConsumeOptions:      []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(pull)},
	})
}

// PublishAll publishes n messages to topic, 500 per Publish call.
func PublishAll(pub message.Publisher, topic string, n int) error {
	batch := make([]*message.Message, 0, 500)
	for i := range n {
		id := watermill.NewUUID()
		batch = append(batch, message.NewMessage(id, fmt.Appendf(nil, `{"order":%q,"amount":%d}`, id, i+1)))
		if len(batch) == cap(batch) || i == n-1 {
			if err := pub.Publish(topic, batch...); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	return nil
}
