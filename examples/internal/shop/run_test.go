package shop

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/examples/internal/broker"
	"github.com/idemkit/watermill-idempotent/middleware"
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
	require.Equal(t, 40, l.Billing[middleware.OutcomeProcessed])
	require.Equal(t, 12, l.Billing.Duplicates())
	require.Equal(t, 2, l.Crashes)
	require.Equal(t, 4, l.Failures)
	require.Equal(t, 50, l.PaymentsPublished, "38 first runs published + 12 replays")
	require.Equal(t, 50, l.PaymentsDelivered)
	require.Equal(t, 10, l.Receipts.Duplicates())
	require.ElementsMatch(t, l.BadUUIDs, l.Poisoned)
	require.True(t, l.ExactlyOnce())
}
