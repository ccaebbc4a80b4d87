package shop

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/idempotency"
)

// TestRunOnGoChannel plays the scenario with no services at all: the
// broker is one configuration value, and the handlers and inboxes are the
// same code the RabbitMQ and Kafka examples run.
func TestRunOnGoChannel(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := Run(ctx, Config{
		Broker:     broker.Config{Kind: broker.GoChannel},
		Database:   SQLite,
		SQLitePath: t.TempDir() + "/shop.db",
	})
	require.NoError(t, err)
	var out bytes.Buffer
	l.Print(&out)
	t.Log("\n" + out.String())

	require.Equal(t, 52, l.Published)
	require.Equal(t, 58, l.Billing.Total(), "52 published + 4 failures + 2 crashes redelivered")
	require.Equal(t, 40, l.Billing[idempotency.OutcomeProcessed])
	require.Equal(t, 12, l.Billing.Duplicates())
	require.Equal(t, 2, l.Crashes)
	require.Equal(t, 4, l.Failures)
	require.Equal(t, 50, l.PaymentsPublished, "38 first runs published + 12 replays")
	require.Equal(t, 50, l.PaymentsDelivered)
	require.Equal(t, 10, l.Receipts.Duplicates())
	require.ElementsMatch(t, l.BadUUIDs, l.Poisoned)
	require.True(t, l.ExactlyOnce())

	// The printed parts add up to the totals.
	require.Contains(t, out.String(), "billing    58 deliveries = 40 processed + 4 failed + 12 duplicates + 2 poisoned\n")
	require.Contains(t, out.String(), "2 of them crashed after the commit, before the ack")
	require.Contains(t, out.String(), "12 duplicates acknowledged without charging: 10 re-sent by the producer, 2 redelivered after a crash\n")
	require.Contains(t, out.String(), "12 replayed the payment stored with the charge")
	require.Contains(t, out.String(), "payments   50 published by the router = 38 after a charge (40 processed - 2 crashed) + 12 replayed; 50 delivered to receipts\n")
	require.Contains(t, out.String(), "receipts   50 deliveries = 40 processed + 10 duplicates skipped; 40 receipts for 40 orders\n")
}
