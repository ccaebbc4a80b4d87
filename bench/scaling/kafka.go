package main

import (
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
)

// kafkaVersion is the newest protocol version Sarama can speak to kfake
// (see examples/internal/e2e/broker/kafka.go).
var kafkaVersion = sarama.V2_3_0_0

// startKfake starts an in-process Kafka-protocol broker on a free port
// with topic created with the given number of partitions.
func startKfake(topic string, partitions int) (*kfake.Cluster, error) {
	return kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0), kfake.SeedTopics(int32(partitions), topic))
}

func newKafkaPublisher(brokers []string) (*kafka.Publisher, error) {
	sc := kafka.DefaultSaramaSyncPublisherConfig()
	sc.Version = kafkaVersion
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
}

// newKafkaSubscriber joins consumer group group: each member owns whole
// partitions and handles one message per partition at a time.
func newKafkaSubscriber(brokers []string, group string) (*kafka.Subscriber, error) {
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Version = kafkaVersion
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
