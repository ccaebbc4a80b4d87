package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
)

// TestRun runs the example as `go run ./examples/kafka` does, through an
// in-process kfake broker, against the real PostgreSQL in a schema of its
// own, and checks the ledger it prints: 12 orders sent as 16 messages,
// each charged once, the 4 re-sends acknowledged as duplicates, one
// payment and one receipt per order.
func TestRun(t *testing.T) {
	dsn := testenv.PostgresSchemaDSN(t, "exkafka_")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a deadline for a stuck run
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, config{PostgresDSN: dsn}, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.Regexp(t, `^run [^:]+: 12 orders published as 16 messages \(4 re-sent with the same UUID\)
billing:  12 charges for 12 orders, \$177\.00; 4 duplicates acknowledged without charging
receipts: 12 payments relayed from the outbox, 12 receipts
every order charged exactly once, one receipt per payment
$`, out.String())
}
