package main

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/shop"
	"github.com/idemkit/watermill-idempotent/health"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
)

// TestRabbitMQ runs the example against the real RabbitMQ with the inbox
// on PostgreSQL (payments through the outbox) and on SQLite (payments
// through the router, replayed to duplicates). RabbitMQ gives each
// consumer one unacknowledged delivery at a time (prefetch 1), so a crash
// requeues exactly the delivery it held and every count is exact.
func TestRabbitMQ(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the whole scenario twice on RabbitMQ; make test runs it (the GoChannel run in examples/internal/e2e/shop covers it here)")
	}
	url := testenv.AMQP(t)
	testenv.Postgres(t)

	for _, db := range []shop.Database{shop.Postgres, shop.SQLite} {
		t.Run(string(db), func(t *testing.T) {
			ms, err := shop.StartMetrics("127.0.0.1:0")
			require.NoError(t, err)
			defer ms.Close()

			// 2 minutes: far above a loaded machine's 25 s.
			l, out := play(t, 2*time.Minute, string(db), shop.Config{
				Broker:        broker.Config{Kind: broker.AMQP, AMQPURL: url},
				Database:      db,
				PostgresDSN:   testenv.PostgresDSN(),
				SQLitePath:    t.TempDir() + "/shop.db",
				Observer:      ms.Metrics,
				RelayObserver: ms.Metrics,
				RelayStarted: func(db *sql.DB, relay *outbox.Relay) {
					h, err := health.NewHandler(health.Config{DB: db, Relay: relay})
					if err == nil {
						ms.SetHealth(h)
					}
				},
			})

			require.Equal(t, orders, l.Orders)
			require.Equal(t, orders+resent+bad, l.Published, "a quarter of the orders re-sent, two bad messages")
			require.Equal(t, resent, l.Resent())
			require.GreaterOrEqual(t, float64(l.Resent())/float64(l.Orders), 0.2, "at least 20% duplicates on the wire")

			b := l.Billing
			require.Equal(t, orders+resent+bad+failures+crashes, b.Total(), "every publish, plus one redelivery per failure and per crash")
			require.Equal(t, orders, b[idempotency.OutcomeProcessed], "each order charged by one delivery")
			require.Equal(t, failures, b[idempotency.OutcomeFailed])
			require.Equal(t, failures, l.Failures)
			require.Equal(t, crashes, l.Crashes)
			require.Zero(t, l.InstancesDown, "a crash closes the delivery's channel; the subscriber survives")
			require.Zero(t, l.Restarts, "watermill-amqp reconnects a crashed subscriber")
			require.Equal(t, resent+crashes, b.Duplicates(), "producer re-sends and crash redeliveries")
			require.Equal(t, 1, b[idempotency.OutcomeNoKey])
			require.Equal(t, 1, b[idempotency.OutcomePayloadMismatch])

			require.Equal(t, orders, l.ChargedOrders)
			require.Zero(t, l.DoubleCharged)
			require.Equal(t, l.Expected, l.Charged)
			require.True(t, l.ChargedOnce())

			if db == shop.Postgres {
				require.True(t, l.ViaOutbox)
				require.Zero(t, b[idempotency.OutcomeReplayed], "nothing to replay: payments left through the outbox")
				require.Equal(t, orders, l.PaymentsPublished, "the relay publishes each committed payment once")
				require.Zero(t, l.OutboxBacklog)
			} else {
				require.False(t, l.ViaOutbox)
				require.Equal(t, resent+crashes, b[idempotency.OutcomeReplayed], "every duplicate replays its payment")
				require.Equal(t, orders-crashes+resent+crashes, l.PaymentsPublished, "crashed runs published nothing; replays publish again")
			}
			require.Equal(t, l.PaymentsPublished, l.PaymentsDelivered, "every payment event delivered downstream")
			require.Equal(t, orders, l.Receipts[idempotency.OutcomeProcessed])
			require.Equal(t, l.PaymentsPublished-orders, l.Receipts.Duplicates())
			require.Equal(t, orders, l.ReceiptRows)
			require.Equal(t, orders, l.ReceiptOrders)

			require.ElementsMatch(t, l.BadUUIDs, l.Poisoned, "the poison queue holds the two bad messages and nothing else")
			require.True(t, l.ExactlyOnce())
			require.Contains(t, out, "every order charged exactly once")
			// The printed parts add up to the totals.
			require.Contains(t, out, "billing    58 deliveries = 40 processed + 4 failed + 12 duplicates + 2 poisoned\n")
			require.Contains(t, out, "2 of them crashed after the commit, before the ack")
			require.Contains(t, out, "12 duplicates acknowledged without charging: 10 re-sent by the producer, 2 redelivered after a crash\n")
			if db == shop.Postgres {
				require.Contains(t, out, "none replays a payment: the payment was written to the outbox with the charge")
				require.Contains(t, out, "payments   40 published by the relay from the outbox, 40 delivered to receipts, 0 left in the outbox\n")
			} else {
				require.Contains(t, out, "payments   50 published by the router = 38 after a charge (40 processed - 2 crashed) + 12 replayed; 50 delivered to receipts\n")
			}

			// /metrics serves what docs/observability.md documents.
			names, body, err := shop.ServedMetrics(ms.Addr)
			require.NoError(t, err)
			documented, err := shop.DocumentedMetrics("../../../docs/observability.md")
			require.NoError(t, err)
			for _, n := range names {
				require.True(t, documented[n], "served metric %s is not in docs/observability.md", n)
			}
			require.Contains(t, body, fmt.Sprintf(`watermill_idempotent_deliveries_total{consumer="shop/billing",outcome="processed"} %d`, orders))
			require.Contains(t, body, fmt.Sprintf(`watermill_idempotent_deliveries_total{consumer="shop/billing",outcome="failed"} %d`, failures))
			require.Contains(t, body, `watermill_idempotent_deliveries_total{consumer="shop/billing",outcome="payload_mismatch"} 1`)
			if db == shop.Postgres { // payments leave through the outbox relay
				require.Contains(t, body, fmt.Sprintf(`watermill_idempotent_relay_published_messages_total{relay="payments"} %d`, orders))
				// /healthz serves the relay's probe next to /metrics: the
				// run is over, so the relay no longer runs.
				resp, err := http.Get("http://" + ms.Addr + "/healthz")
				require.NoError(t, err)
				probe, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
				require.JSONEq(t, `{"status":"fail","checks":{"relay":{"status":"fail","error":"relay is not running"}}}`, string(probe))
			}
		})
	}
}
