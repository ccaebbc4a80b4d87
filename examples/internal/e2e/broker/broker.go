// Package broker picks the Watermill publisher and subscribers from one
// configuration value, so the handlers and the inbox never change when the
// broker does. It is the one place to copy into a service that must run on
// RabbitMQ in one environment and Kafka in another.
//
//	cfg := broker.ConfigFromEnv()    // BROKER=amqp|kafka|gochannel, AMQP_URL, KAFKA_BROKERS
//	cfg.RegisterFlags(flag.CommandLine) // -broker, -amqp-url, -kafka-brokers override the environment
//	flag.Parse()
//	b, err := broker.Open(cfg, logger)
//	if err != nil { … }
//	defer b.Close()
//	sub, err := b.NewSubscriber("billing") // instances of one group compete for messages
//	router.AddHandler("billing", "orders", sub, "payments", b.Publisher(), handle)
//
// Topics map to the broker's own concepts like this:
//
//   - amqp (watermill-amqp v2): a durable fanout exchange per topic and a
//     durable queue per topic and group ("<topic>_<group>"), persistent
//     messages. Subscribers of one group consume one queue: competing
//     consumers. Publishing to a topic no group has subscribed to yet
//     drops the message (fanout with no queue bound), so subscribe first.
//   - kafka (watermill-kafka v3, Sarama): a topic, and a consumer group per
//     group. Create topics with enough partitions (CreateTopics) for every
//     instance to get some.
//   - gochannel: in-process; each group shares one subscription whose
//     messages its subscribers compete for. Nothing survives the process.
package broker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// Kind names a broker.
type Kind string

// The supported brokers.
const (
	AMQP      Kind = "amqp"
	Kafka     Kind = "kafka"
	GoChannel Kind = "gochannel"
)

// Environment variables read by ConfigFromEnv.
const (
	KindEnv         = "BROKER"
	AMQPURLEnv      = "AMQP_URL"
	KafkaBrokersEnv = "KAFKA_BROKERS"
)

// Defaults used when neither a flag nor the environment says otherwise.
const (
	DefaultAMQPURL         = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultKafkaPartitions = 4
)

// Config selects and addresses the broker.
type Config struct {
	// Kind selects the broker. Required.
	Kind Kind
	// AMQPURL is the RabbitMQ URL. Default: DefaultAMQPURL.
	AMQPURL string
	// KafkaBrokers are the Kafka bootstrap addresses. Required for Kafka.
	KafkaBrokers []string
	// KafkaPartitions is the partition count of topics made by
	// CreateTopics. Default: DefaultKafkaPartitions.
	KafkaPartitions int32
}

// ConfigFromEnv returns a Config read from BROKER, AMQP_URL and
// KAFKA_BROKERS (comma-separated), with def's values where a variable is
// unset.
func ConfigFromEnv(def Config) Config {
	c := def
	if v := os.Getenv(KindEnv); v != "" {
		c.Kind = Kind(v)
	}
	if v := os.Getenv(AMQPURLEnv); v != "" {
		c.AMQPURL = v
	}
	if v := os.Getenv(KafkaBrokersEnv); v != "" {
		c.KafkaBrokers = splitList(v)
	}
	return c
}

// RegisterFlags defines -broker, -amqp-url and -kafka-brokers on fs, with
// c's current values as defaults; parsing fs overwrites them.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Func("broker", fmt.Sprintf("broker: amqp, kafka or gochannel (env %s; default %q)", KindEnv, c.Kind), func(s string) error {
		c.Kind = Kind(s)
		return c.validateKind()
	})
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ URL (env "+AMQPURLEnv+")")
	fs.Func("kafka-brokers", fmt.Sprintf("comma-separated Kafka bootstrap addresses (env %s; default %q)", KafkaBrokersEnv, strings.Join(c.KafkaBrokers, ",")), func(s string) error {
		c.KafkaBrokers = splitList(s)
		return nil
	})
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (c *Config) setDefaults() {
	if c.AMQPURL == "" {
		c.AMQPURL = DefaultAMQPURL
	}
	if c.KafkaPartitions == 0 {
		c.KafkaPartitions = DefaultKafkaPartitions
	}
}

func (c Config) validateKind() error {
	switch c.Kind {
	case AMQP, Kafka, GoChannel:
		return nil
	}
	return fmt.Errorf("unknown broker %q: want amqp, kafka or gochannel", c.Kind)
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error {
	if err := c.validateKind(); err != nil {
		return err
	}
	if c.Kind == Kafka && len(c.KafkaBrokers) == 0 {
		return errors.New("kafka needs at least one broker address")
	}
	if c.KafkaPartitions < 0 {
		return errors.New("KafkaPartitions must not be negative")
	}
	return nil
}

// Broker is a connected publisher and a factory of subscribers for one
// broker. It is safe for concurrent use.
type Broker struct {
	config Config
	logger watermill.LoggerAdapter

	publisher message.Publisher
	goChannel *gochannel.GoChannel // GoChannel only

	mu     sync.Mutex
	groups map[string]*sharedGroup // GoChannel only: one subscription per topic and group
	// names of what the subscribers declared, for DeleteTopics
	queues map[string]struct{}
	closed bool
}

// Open connects the publisher. Subscribers connect in NewSubscriber.
// logger may be nil (watermill.NopLogger).
func Open(config Config, logger watermill.LoggerAdapter) (*Broker, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	b := &Broker{config: config, logger: logger, groups: map[string]*sharedGroup{}, queues: map[string]struct{}{}}
	var err error
	switch config.Kind {
	case AMQP:
		b.publisher, err = newAMQPPublisher(config, logger)
	case Kafka:
		b.publisher, err = newKafkaPublisher(config, logger)
	case GoChannel:
		b.goChannel = gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, logger)
		b.publisher = b.goChannel
	}
	if err != nil {
		return nil, fmt.Errorf("broker %s: %w", config.Kind, err)
	}
	return b, nil
}

// Kind returns the broker in use.
func (b *Broker) Kind() Kind { return b.config.Kind }

// Publisher returns the broker's shared publisher. Its Close does nothing
// (the Broker owns the connection and closes it in Close), so it can be
// given to several routers, which close their publishers when they stop.
func (b *Broker) Publisher() message.Publisher { return sharedPublisher{b.publisher} }

type sharedPublisher struct{ message.Publisher }

func (sharedPublisher) Close() error { return nil }

// NewSubscriber returns a subscriber of group: every subscriber of one
// group competes for the group's messages (one gets each), and each group
// gets every message of a topic. Each subscriber has its own connection
// (AMQP) or consumer-group member (Kafka), like a separate process; the
// caller (usually its router) closes it.
func (b *Broker) NewSubscriber(group string) (message.Subscriber, error) {
	if group == "" {
		return nil, errors.New("broker: empty group")
	}
	var (
		sub message.Subscriber
		err error
	)
	switch b.config.Kind {
	case AMQP:
		sub, err = b.newAMQPSubscriber(group)
	case Kafka:
		sub, err = newKafkaSubscriber(b.config, group, b.logger)
	case GoChannel:
		sub = &goChannelSubscriber{broker: b, group: group}
	}
	if err != nil {
		return nil, fmt.Errorf("broker %s: subscriber of %s: %w", b.config.Kind, group, err)
	}
	return sub, nil
}

// CreateTopics makes sure topics exist with KafkaPartitions partitions
// (Kafka); an existing topic is left as it is. AMQP and GoChannel create
// what they need on subscribe and publish, so it does nothing there.
func (b *Broker) CreateTopics(ctx context.Context, topics ...string) error {
	if b.config.Kind != Kafka {
		return nil
	}
	return createKafkaTopics(ctx, b.config, topics)
}

// DeleteTopics deletes the topics and everything this Broker's
// subscribers declared for them: AMQP exchanges and queues, Kafka topics.
// Use it to leave a shared server clean after a run.
func (b *Broker) DeleteTopics(ctx context.Context, topics ...string) error {
	switch b.config.Kind {
	case AMQP:
		b.mu.Lock()
		queues := make([]string, 0, len(b.queues))
		for q := range b.queues {
			queues = append(queues, q)
		}
		b.mu.Unlock()
		return deleteAMQP(ctx, b.config, topics, queues)
	case Kafka:
		return deleteKafkaTopics(ctx, b.config, topics)
	}
	return nil
}

// Close closes the publisher (and, for GoChannel, every subscription).
// Close subscribers (their routers) first.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	groups := b.groups
	b.groups = map[string]*sharedGroup{}
	b.mu.Unlock()
	for _, g := range groups {
		g.cancel()
		g.wg.Wait()
	}
	if err := b.publisher.Close(); err != nil {
		return fmt.Errorf("broker %s: closing the publisher: %w", b.config.Kind, err)
	}
	return nil
}
