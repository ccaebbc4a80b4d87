package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
)

// TestRun runs the example against the real RabbitMQ and PostgreSQL, with
// its own exchanges, queues and schema, and checks the ledger it prints:
// 12 orders sent as 16 messages, each charged once, the 4 re-sends
// acknowledged as duplicates, one payment and one receipt per order.
func TestRun(t *testing.T) {
	url := testenv.AMQP(t)
	dsn := testenv.PostgresSchemaDSN(t, "exrabbitmq_")
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "ex" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		conn, err := amqp091.Dial(url)
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		for _, topic := range []string{"orders", "payments"} {
			_, err := ch.QueueDelete(prefix+topic+"_shop", false, false, false)
			require.NoError(t, err)
			require.NoError(t, ch.ExchangeDelete(prefix+topic, false, false))
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a deadline for a stuck run
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, config{AMQPURL: url, PostgresDSN: dsn, Prefix: prefix}, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.Regexp(t, `^run [^:]+: 12 orders published as 16 messages \(4 re-sent with the same UUID\)
billing:  12 charges for 12 orders, \$177\.00; 4 duplicates acknowledged without charging
receipts: 12 payments relayed from the outbox, 12 receipts
every order charged exactly once, one receipt per payment
$`, out.String())
}
