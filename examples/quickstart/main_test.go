package main

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQuickstart(t *testing.T) {
	var out bytes.Buffer
	s, err := run(t.Context(), filepath.Join(t.TempDir(), "quickstart.db"), &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())

	require.Equal(t, 10, s.Orders)
	require.Equal(t, 13, s.Published, "3 orders re-sent by the producer")
	require.Equal(t, 15, s.BillingDeliveries, "13 published + 1 redelivery after the failure + 1 after the crash")
	require.Equal(t, 10, s.Charged, "each order charged once")
	require.Equal(t, 1, s.Failed)
	require.Equal(t, 1, s.Crashed)
	require.Equal(t, 4, s.Duplicates, "3 producer re-sends + the redelivery after the crash")
	require.Zero(t, s.Replayed, "duplicates replay nothing: the payment events are in the outbox")
	require.Equal(t, 10, s.Relayed, "one payment event per charge, the crashed order's included")
	require.Zero(t, s.OutboxLeft)
	require.Equal(t, 10, s.PaymentEvents)
	require.Equal(t, 10, s.ReceiptsSent)
	require.Zero(t, s.ReceiptsSkipped)
	require.Equal(t, map[string]int{"alice": 4075, "bob": 5550, "carol": 10650}, s.ChargedCents)
	require.Equal(t, map[string]int{"alice": 4, "bob": 3, "carol": 3}, s.ChargeCount)

	// The summary's parts add up to its totals: the crash is one of the
	// charged deliveries, its redelivery one of the duplicates.
	require.Equal(t, s.BillingDeliveries, s.Charged+s.Failed+s.Duplicates)
	require.Equal(t, s.PaymentEvents, s.Charged+s.Replayed)
	require.Equal(t, s.PaymentEvents, s.ReceiptsSent+s.ReceiptsSkipped)
	require.Contains(t, out.String(), "billing    15 deliveries = 10 charged + 1 failed + 4 duplicates\n")
	require.Contains(t, out.String(), "1 of them crashed after the commit, before the ack")
	require.Contains(t, out.String(), "4 duplicates acknowledged without charging: 3 re-sent by the producer, 1 redelivered after the crash\n")
	require.Contains(t, out.String(), "payments   10 published by the relay from the outbox = 10 charged; 0 rows left in the outbox\n")
	require.Contains(t, out.String(), "receipts   10 payment events delivered = 10 receipts sent + 0 duplicates skipped\n")
	require.Contains(t, out.String(), "every order charged exactly once")
	require.NotContains(t, out.String(), "MISMATCH")
}
