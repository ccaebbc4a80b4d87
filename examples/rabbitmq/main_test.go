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

	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
)

// TestRun runs the example against the real RabbitMQ and PostgreSQL, with
// its own tables, exchanges and queues, and checks the ledger it prints:
// 12 orders sent as 16 messages, each charged once, the 4 re-sends
// acknowledged as duplicates, one payment and one receipt per order.
func TestRun(t *testing.T) {
	url := testenv.AMQP(t)
	db := testenv.Postgres(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "ex" + hex.EncodeToString(b[:]) + "_"
	t.Cleanup(func() {
		for _, table := range []string{"inbox", "outbox", "charges", "receipts"} {
			_, _ = db.Exec(`DROP TABLE IF EXISTS ` + prefix + table)
		}
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + outbox.DeadLetterTableName(prefix+"outbox"))
		_, _ = db.Exec(`DROP FUNCTION IF EXISTS ` + prefix + `outbox_notify()`)
		conn, err := amqp091.Dial(url)
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		for _, q := range []string{"orders_shop", "payments_shop"} {
			_, err := ch.QueueDelete(prefix+q, false, false, false)
			require.NoError(t, err)
		}
		for _, e := range []string{"orders", "payments"} {
			require.NoError(t, ch.ExchangeDelete(prefix+e, false, false))
		}
	})

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a deadline for a stuck run
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, config{AMQPURL: url, PostgresDSN: testenv.PostgresDSN(), Prefix: prefix}, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.Regexp(t, `^run [^:]+: 12 orders published as 16 messages \(4 re-sent with the same UUID\)
billing:  12 charges for 12 orders, \$177\.00; 4 duplicates acknowledged without charging
receipts: 12 payments relayed from the outbox, 12 receipts
every order charged exactly once, one receipt per payment
$`, out.String())
}
