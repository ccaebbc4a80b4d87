package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/shop"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
)

// TestNATS plays the scenario on the real NATS server (JetStream, durable
// pull consumers). A crash closes the subscriber holding the delivery; the
// message's ack wait runs out and JetStream redelivers it to the other
// subscriber of the durable consumer, and a replacement instance joins.
func TestNATS(t *testing.T) {
	url := natsServer(t)
	testenv.Postgres(t)
	playOnReplacedSubscribers(t, broker.Config{Kind: broker.NATS, NATSURL: url})
}

// TestRedisStream plays the scenario on the real Redis (Streams, consumer
// groups). A crash closes the consumer holding the delivery; the message
// stays pending under its name until another consumer of the group claims
// it (XCLAIM after the max idle time), and a replacement instance joins.
func TestRedisStream(t *testing.T) {
	testenv.Redis(t)
	testenv.Postgres(t)
	playOnReplacedSubscribers(t, broker.Config{Kind: broker.RedisStream, RedisAddr: testenv.RedisAddr()})
}

// TestSQL plays the scenario on watermill-sql's Pub/Sub on the real
// PostgreSQL (the same database as the inbox). A crash closes the
// subscriber holding the delivery; its transaction ends without moving the
// group's offset, the next subscriber reads the message again, and a
// replacement instance joins.
func TestSQL(t *testing.T) {
	testenv.Postgres(t)
	playOnReplacedSubscribers(t, broker.Config{Kind: broker.SQL, SQLDSN: testenv.PostgresDSN()})
}

// playOnReplacedSubscribers runs the scenario with the inbox on PostgreSQL
// (payments through the outbox) on a broker where a crash takes the
// subscriber down and a replacement joins, and asserts the ledger. Each
// subscriber holds one message at a time, so processed deliveries and
// duplicates are exact. A subscriber that is closing can still hand one
// more message to its router (watermill's subscribers select between
// sending it and closing), whose context the close then cancels: that
// delivery fails, nothing committed, and is redelivered. So each crash
// adds at most one failed delivery, and the total is every publish plus
// one redelivery per failed delivery and per crash.
func playOnReplacedSubscribers(t *testing.T, config broker.Config) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short: the whole scenario on %s; make test runs it (the GoChannel run in examples/internal/e2e/shop covers it here)", config.Kind)
	}
	// A deadline for a stuck run. The sql broker stalls while any
	// transaction in the PostgreSQL cluster is older than its newest
	// messages (see docs/examples.md), and the cluster is shared.
	l, out := play(t, 5*time.Minute, string(config.Kind), shop.Config{Broker: config, Database: shop.Postgres, PostgresDSN: testenv.PostgresDSN()})

	require.Equal(t, orders, l.Orders)
	require.Equal(t, orders+resent+bad, l.Published, "a quarter of the orders re-sent, two bad messages")
	require.Equal(t, resent, l.Resent())

	b := l.Billing
	require.Equal(t, orders, b[idempotency.OutcomeProcessed], "each order charged by one delivery")
	require.Equal(t, resent+crashes, b.Duplicates(), "producer re-sends and crash redeliveries")
	require.Equal(t, failures, l.Failures, "injected failures")
	require.Equal(t, crashes, l.Crashes)
	require.GreaterOrEqual(t, b[idempotency.OutcomeFailed], failures)
	require.LessOrEqual(t, b[idempotency.OutcomeFailed], failures+crashes, "a crash interrupts at most the one delivery its subscriber handed over while closing")
	require.Equal(t, l.Published+b[idempotency.OutcomeFailed]+crashes, b.Total(), "every publish, plus one redelivery per failed delivery and per crash")
	require.GreaterOrEqual(t, l.InstancesDown, 1, "a crash takes its subscriber down")
	require.LessOrEqual(t, l.InstancesDown, crashes)
	require.Equal(t, l.InstancesDown, l.Restarts, "each crashed instance replaced by a new one")
	require.Equal(t, 1, b[idempotency.OutcomeNoKey])
	require.Equal(t, 1, b[idempotency.OutcomePayloadMismatch])

	require.Equal(t, orders, l.ChargedOrders)
	require.Zero(t, l.DoubleCharged)
	require.Equal(t, l.Expected, l.Charged)
	require.True(t, l.ChargedOnce())

	require.True(t, l.ViaOutbox)
	require.Zero(t, b[idempotency.OutcomeReplayed], "nothing to replay: payments left through the outbox")
	require.Equal(t, orders, l.PaymentsPublished, "the relay publishes each committed payment once")
	require.Equal(t, orders, l.PaymentsDelivered)
	require.Zero(t, l.OutboxBacklog)
	require.Equal(t, orders, l.Receipts[idempotency.OutcomeProcessed])
	require.Zero(t, l.Receipts.Duplicates())
	require.Equal(t, orders, l.ReceiptRows)
	require.Equal(t, orders, l.ReceiptOrders)

	require.ElementsMatch(t, l.BadUUIDs, l.Poisoned, "the poison topic holds the two bad messages and nothing else")
	require.True(t, l.ExactlyOnce())
	require.Contains(t, out, fmt.Sprintf("billing    %d deliveries = 40 processed + %d failed + 12 duplicates + 2 poisoned\n", b.Total(), b[idempotency.OutcomeFailed]))
	require.Contains(t, out, "12 duplicates acknowledged without charging: 10 re-sent by the producer, 2 redelivered after a crash\n")
	require.Contains(t, out, "payments   40 published by the relay from the outbox, 40 delivered to receipts, 0 left in the outbox\n")
	require.Contains(t, out, "every order charged exactly once")
}

// The scenario's counts with shop's defaults (shop.DefaultOrders): orders
// placed, re-sent by the producer, bad messages, injected failures and
// crashes (shop.FaultsFor).
const orders, resent, bad, failures, crashes = 40, 10, 2, 4, 2

// play runs the scenario with config under a deadline of timeout (for a
// stuck run), logs its ledger under name and returns the ledger and its
// printed form.
func play(t *testing.T, timeout time.Duration, name string, config shop.Config) (*shop.Ledger, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	start := time.Now()
	l, err := shop.Run(ctx, config)
	require.NoError(t, err)
	var out bytes.Buffer
	l.Print(&out)
	t.Logf("%s in %s\n%s", name, time.Since(start).Round(time.Millisecond), out.String())
	return l, out.String()
}
