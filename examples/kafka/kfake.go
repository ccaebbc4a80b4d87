package main

import (
	"errors"
	"strings"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// The Kafka plumbing around the service: a broker for `go run` without
// one, the protocol version and the topics.

// kafkaBrokers splits brokers, the comma-separated bootstrap addresses of
// your Kafka, or, when it is empty, starts an in-process Kafka (franz-go's
// kfake), so that `go run ./examples/kafka` needs no Kafka server. stop
// shuts kfake down. kfake's go.mod asks for franz-go v1.21.7 but its code
// needs v1.22: in a module of your own, `go get github.com/twmb/franz-go@v1.22.3`.
func kafkaBrokers(brokers string) (addrs []string, stop func(), err error) {
	if brokers != "" {
		return strings.Split(brokers, ","), func() {}, nil
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, nil, err
	}
	return cluster.ListenAddrs(), cluster.Close, nil
}

// saramaConfig sets the protocol version to Kafka 2.3.0, the newest kfake
// accepts from Sarama; Kafka 2.3 and later accept it too.
func saramaConfig(sc *sarama.Config) *sarama.Config {
	sc.Version = sarama.V2_3_0_0
	return sc
}

// createTopics creates the topics with 4 partitions each, unless they exist.
func createTopics(brokers []string, sc *sarama.Config, topics ...string) error {
	admin, err := sarama.NewClusterAdmin(brokers, sc)
	if err != nil {
		return err
	}
	defer admin.Close()
	for _, topic := range topics {
		err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return err
		}
	}
	return nil
}
