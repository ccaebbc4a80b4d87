package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// kafkaVersion is the protocol version Sarama speaks. 2.3.0 is the newest
// the in-process kfake broker used by the examples and tests understands
// from Sarama: with a newer Version the consumer group's JoinGroup/SyncGroup
// responses fail to decode and the group never starts. A real Kafka (2.3 or
// later) accepts it too; raise it only when not running against kfake.
var kafkaVersion = sarama.V2_3_0_0

func newKafkaPublisher(config Config, logger watermill.LoggerAdapter) (*kafka.Publisher, error) {
	sc := kafka.DefaultSaramaSyncPublisherConfig()
	sc.Version = kafkaVersion
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	sc.Producer.RequiredAcks = sarama.WaitForAll
	return kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               config.KafkaBrokers,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
	}, logger)
}

func newKafkaSubscriber(config Config, group string, logger watermill.LoggerAdapter) (*kafka.Subscriber, error) {
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Version = kafkaVersion
	// A group that has committed nothing yet starts at the beginning, so
	// messages published before an instance joined are not skipped.
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	// Offsets of acknowledged messages are committed every 100ms and when
	// the member leaves; an unacknowledged message is never committed.
	sc.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	// Members notice a rebalance at their next heartbeat: keep it short so
	// a departed member's partitions move quickly.
	sc.Consumer.Group.Heartbeat.Interval = 300 * time.Millisecond
	sc.Consumer.Group.Rebalance.Retry.Backoff = 250 * time.Millisecond
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	return kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               config.KafkaBrokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   250 * time.Millisecond,
	}, logger)
}

func kafkaAdmin(config Config) (sarama.ClusterAdmin, error) {
	sc := sarama.NewConfig()
	sc.Version = kafkaVersion
	admin, err := sarama.NewClusterAdmin(config.KafkaBrokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	return admin, nil
}

func createKafkaTopics(_ context.Context, config Config, topics []string) error {
	admin, err := kafkaAdmin(config)
	if err != nil {
		return err
	}
	defer admin.Close()
	for _, t := range topics {
		err := admin.CreateTopic(t, &sarama.TopicDetail{NumPartitions: config.KafkaPartitions, ReplicationFactor: 1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return fmt.Errorf("kafka: creating topic %s: %w", t, err)
		}
	}
	return nil
}

func deleteKafkaTopics(_ context.Context, config Config, topics []string) error {
	admin, err := kafkaAdmin(config)
	if err != nil {
		return err
	}
	defer admin.Close()
	var errs []error
	for _, t := range topics {
		if err := admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			errs = append(errs, fmt.Errorf("kafka: deleting topic %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}
