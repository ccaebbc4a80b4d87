// Package broker picks the Watermill publisher and subscribers from one
// configuration value, so the handlers and the inbox never change when the
// broker does: the one place that knows about RabbitMQ, Kafka, NATS
// JetStream, Redis Streams, watermill-sql on PostgreSQL and GoChannel.
//
//	cfg := broker.ConfigFromEnv(broker.Config{Kind: broker.AMQP}) // BROKER, AMQP_URL, KAFKA_BROKERS, NATS_URL, REDIS_ADDR, SQL_DSN
//	cfg.RegisterFlags(flag.CommandLine) // -broker, -amqp-url, … override the environment
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
//   - nats (watermill-nats v2's JetStream package): a stream per topic
//     (CreateTopics) and a durable pull consumer per topic and group, which
//     the group's subscribers pull from: competing consumers. A message
//     not acked within the ack wait (3s here) is redelivered.
//   - redis (watermill-redisstream): a stream per topic and a consumer group
//     per group. A message read and not acked stays pending and is claimed
//     by another consumer once idle for 3s (here).
//   - sql (watermill-sql v3 on PostgreSQL): a table per topic and an offset
//     row per topic and group, locked while a subscriber holds a message,
//     so a group's subscribers take turns.
//   - gochannel: in-process; each group shares one subscription whose
//     messages its subscribers compete for. Nothing survives the process.
package broker

import (
	"context"
	stdsql "database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
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
	AMQP        Kind = "amqp"
	Kafka       Kind = "kafka"
	NATS        Kind = "nats"
	RedisStream Kind = "redis"
	SQL         Kind = "sql"
	GoChannel   Kind = "gochannel"
)

// Kinds lists every broker Open accepts.
var Kinds = []Kind{AMQP, Kafka, NATS, RedisStream, SQL, GoChannel}

// Environment variables read by ConfigFromEnv.
const (
	KindEnv         = "BROKER"
	AMQPURLEnv      = "AMQP_URL"
	KafkaBrokersEnv = "KAFKA_BROKERS"
	NATSURLEnv      = "NATS_URL"
	RedisAddrEnv    = "REDIS_ADDR"
	SQLDSNEnv       = "SQL_DSN"
)

// Defaults used when neither a flag nor the environment says otherwise.
const (
	DefaultAMQPURL         = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultNATSURL         = "nats://127.0.0.1:4222"
	DefaultRedisAddr       = "127.0.0.1:6379"
	DefaultSQLDSN          = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
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
	// NATSURL is the NATS server (with JetStream enabled). Default:
	// DefaultNATSURL.
	NATSURL string
	// RedisAddr is the Redis server. Default: DefaultRedisAddr.
	RedisAddr string
	// SQLDSN is the PostgreSQL database watermill-sql keeps its topics in
	// (pgx). Default: DefaultSQLDSN.
	SQLDSN string
}

// ConfigFromEnv returns a Config read from BROKER, AMQP_URL,
// KAFKA_BROKERS (comma-separated), NATS_URL, REDIS_ADDR and SQL_DSN, with
// def's values where a variable is unset and the defaults where def has
// none.
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
	if v := os.Getenv(NATSURLEnv); v != "" {
		c.NATSURL = v
	}
	if v := os.Getenv(RedisAddrEnv); v != "" {
		c.RedisAddr = v
	}
	if v := os.Getenv(SQLDSNEnv); v != "" {
		c.SQLDSN = v
	}
	c.setDefaults()
	return c
}

// RegisterFlags defines -broker, -amqp-url, -kafka-brokers, -nats-url,
// -redis-addr and -sql-dsn on fs, with
// c's current values as defaults; parsing fs overwrites them.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Func("broker", fmt.Sprintf("broker: %s (env %s; default %q)", kindList(), KindEnv, c.Kind), func(s string) error {
		c.Kind = Kind(s)
		return c.validateKind()
	})
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ URL (env "+AMQPURLEnv+")")
	fs.Func("kafka-brokers", fmt.Sprintf("comma-separated Kafka bootstrap addresses (env %s; default %q)", KafkaBrokersEnv, strings.Join(c.KafkaBrokers, ",")), func(s string) error {
		c.KafkaBrokers = splitList(s)
		return nil
	})
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS URL, JetStream enabled (env "+NATSURLEnv+")")
	fs.StringVar(&c.RedisAddr, "redis-addr", c.RedisAddr, "Redis address (env "+RedisAddrEnv+")")
	fs.StringVar(&c.SQLDSN, "sql-dsn", c.SQLDSN, "PostgreSQL DSN of the watermill-sql broker (env "+SQLDSNEnv+")")
}

func kindList() string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = string(k)
	}
	return strings.Join(names, ", ")
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
	if c.NATSURL == "" {
		c.NATSURL = DefaultNATSURL
	}
	if c.RedisAddr == "" {
		c.RedisAddr = DefaultRedisAddr
	}
	if c.SQLDSN == "" {
		c.SQLDSN = DefaultSQLDSN
	}
}

func (c Config) validateKind() error {
	if slices.Contains(Kinds, c.Kind) {
		return nil
	}
	return fmt.Errorf("unknown broker %q: want one of %s", c.Kind, kindList())
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
	sqlDB     *stdsql.DB           // SQL only

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
	case NATS:
		b.publisher, err = newNATSPublisher(config, logger)
	case RedisStream:
		b.publisher, err = newRedisPublisher(config, logger)
	case SQL:
		if b.sqlDB, err = openSQL(config); err == nil {
			b.publisher, err = newSQLPublisher(b.sqlDB, logger)
		}
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
	case NATS:
		sub, err = newNATSSubscriber(b.config, group, b.logger)
	case RedisStream:
		sub, err = newRedisSubscriber(b.config, group, b.logger)
	case SQL:
		sub, err = newSQLSubscriber(b.sqlDB, group, b.logger)
	case GoChannel:
		sub = &goChannelSubscriber{broker: b, group: group}
	}
	if err != nil {
		return nil, fmt.Errorf("broker %s: subscriber of %s: %w", b.config.Kind, group, err)
	}
	return sub, nil
}

// CreateTopics makes sure topics exist: Kafka topics with KafkaPartitions
// partitions, NATS streams; an existing one is left as it is. The other
// brokers create what they need on subscribe and publish, so it does
// nothing there.
func (b *Broker) CreateTopics(ctx context.Context, topics ...string) error {
	switch b.config.Kind {
	case Kafka:
		return createKafkaTopics(ctx, b.config, topics)
	case NATS:
		return createNATSStreams(ctx, b.config, topics)
	}
	return nil
}

// DeleteTopics deletes the topics and everything this Broker's
// subscribers declared for them: AMQP exchanges and queues, Kafka topics,
// NATS streams (with their consumers), Redis streams (with their groups),
// watermill-sql's message and offsets tables.
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
	case NATS:
		return deleteNATSStreams(ctx, b.config, topics)
	case RedisStream:
		return deleteRedisStreams(ctx, b.config, topics)
	case SQL:
		return deleteSQLTopics(ctx, b.sqlDB, topics)
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
	err := b.publisher.Close()
	if err != nil {
		err = fmt.Errorf("broker %s: closing the publisher: %w", b.config.Kind, err)
	}
	if b.sqlDB != nil {
		err = errors.Join(err, b.sqlDB.Close())
	}
	return err
}
