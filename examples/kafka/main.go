// Command kafka runs the orders → payments example on Kafka
// (watermill-kafka v3, Sarama, a consumer group) with the inbox on
// PostgreSQL and payment events leaving through the transactional outbox.
//
//	go run ./examples/kafka                                 # in-process kfake broker
//	go run ./examples/kafka -kafka-brokers=127.0.0.1:9092   # a real Kafka (see README.md)
//
// Two billing instances share one consumer group over a 4-partition
// topic. The producer re-sends a quarter of the orders after "lost"
// publish confirmations, some charges fail once and roll back, and two
// instances crash after their commit and before their offset is
// committed: the member leaves the group, the group rebalances, the
// partition's next owner consumes the order again, and a replacement
// instance joins. Two deliberately bad messages go to the poison topic.
// The run ends with a ledger showing every order charged exactly once and
// every payment delivered to the receipts service once.
//
// With no -kafka-brokers (or KAFKA_BROKERS) it starts an in-process
// Kafka-protocol broker (github.com/twmb/franz-go/pkg/kfake), so it runs
// anywhere PostgreSQL does; -db=sqlite needs no service at all. The
// broker is configuration: -broker=amqp or -broker=gochannel runs the same
// handlers elsewhere. Every run uses its own topics, consumer groups and
// tables and deletes them at the end unless -keep.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/watermill-idempotent/examples/internal/broker"
	"github.com/idemkit/watermill-idempotent/examples/internal/shop"
)

func main() {
	cli := shop.NewCLI(flag.CommandLine, broker.Kafka)
	flag.Parse()
	if err := run(cli); err != nil {
		fmt.Fprintln(os.Stderr, "kafka example:", err)
		os.Exit(1)
	}
}

func run(cli *shop.CLI) error {
	if cli.Config.Broker.Kind == broker.Kafka && len(cli.Config.Broker.KafkaBrokers) == 0 {
		cluster, err := startKfake()
		if err != nil {
			return err
		}
		defer cluster.Close()
		cli.Config.Broker.KafkaBrokers = cluster.ListenAddrs()
		fmt.Printf("no -kafka-brokers given: started an in-process kfake broker at %v\n\n", cli.Config.Broker.KafkaBrokers)
	}
	return cli.Run(os.Stdout)
}

// startKfake starts an in-process Kafka-protocol broker on a free local
// port. Sarama must speak protocol 2.3.0 or older to it (see
// examples/internal/broker/kafka.go).
func startKfake() (*kfake.Cluster, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0))
	if err != nil {
		return nil, fmt.Errorf("starting kfake: %w", err)
	}
	return cluster, nil
}
