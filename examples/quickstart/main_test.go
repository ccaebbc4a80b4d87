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
	require.Equal(t, 4, s.Replayed)
	require.Equal(t, 13, s.PaymentEvents, "one payment event per acknowledged order delivery")
	require.Equal(t, 10, s.ReceiptsSent)
	require.Equal(t, 3, s.ReceiptsSkipped)
	require.Equal(t, map[string]int{"alice": 4075, "bob": 5550, "carol": 10650}, s.ChargedCents)
	require.Equal(t, map[string]int{"alice": 4, "bob": 3, "carol": 3}, s.ChargeCount)

	require.Contains(t, out.String(), "every order charged exactly once")
	require.Contains(t, out.String(), "4 duplicates acknowledged without charging")
	require.NotContains(t, out.String(), "MISMATCH")
}
