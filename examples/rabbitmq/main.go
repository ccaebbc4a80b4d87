// Command rabbitmq runs the orders → payments example on RabbitMQ
// (watermill-amqp v2, durable exchanges and queues) with the inbox on
// PostgreSQL and payment events leaving through the transactional outbox.
//
//	go run ./examples/rabbitmq
//
// Two billing instances compete for one durable queue. The producer
// re-sends a quarter of the orders after "lost" publish confirmations,
// some charges fail once and roll back, two instances crash after their
// commit and before the ack (their AMQP connection is closed, so RabbitMQ
// requeues and redelivers for real), and two deliberately bad messages go
// to the poison queue. The run ends with a ledger showing every order
// charged exactly once and every payment delivered to the receipts
// service once.
//
// Addresses come from flags or the environment, with localhost defaults:
// -amqp-url (AMQP_URL, amqp://guest:guest@127.0.0.1:5672/), -postgres-dsn
// (POSTGRES_DSN). -db=sqlite keeps the inbox in SQLite instead (payments
// then leave through the router and are replayed to duplicates). The
// broker itself is configuration: -broker=kafka or -broker=gochannel runs
// the same handlers elsewhere. Every run uses its own queues, exchanges
// and tables (suffix -run) and deletes them at the end unless -keep.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/idemkit/watermill-idempotent/examples/internal/broker"
	"github.com/idemkit/watermill-idempotent/examples/internal/shop"
)

func main() {
	cli := shop.NewCLI(flag.CommandLine, broker.AMQP)
	flag.Parse()
	if err := cli.Run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rabbitmq example:", err)
		os.Exit(1)
	}
}
