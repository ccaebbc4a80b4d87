// Command e2e is the fault-injection harness behind the examples: the
// orders → payments service of examples/rabbitmq and examples/kafka played
// with two competing billing instances, producer re-sends, failing
// charges, instances crashing after the commit and before the ack, and a
// poison queue, on any broker the -broker flag names. It ends with a
// ledger and fails unless every order was charged exactly once.
//
//	go run ./examples/internal/e2e                        # RabbitMQ + PostgreSQL
//	go run ./examples/internal/e2e -broker=kafka          # in-process kfake broker
//	go run ./examples/internal/e2e -broker=gochannel -db=sqlite
//
// Its tests run the same scenario against the real servers and assert
// every count of the ledger; see docs/examples.md.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/shop"
)

func main() {
	cli := shop.NewCLI(flag.CommandLine, broker.AMQP)
	flag.Parse()
	if err := run(cli); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
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
// broker/kafka.go).
func startKfake() (*kfake.Cluster, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0))
	if err != nil {
		return nil, fmt.Errorf("starting kfake: %w", err)
	}
	return cluster, nil
}
