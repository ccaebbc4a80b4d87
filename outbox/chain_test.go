package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// TestChainInboxOutboxRelayInbox runs the whole pattern with duplicates at
// every hop: orders published twice by the producer → billing inbox whose
// handler charges and writes payment-completed to the outbox in the same
// transaction (some deliveries "crash" after commit, before the ack, and
// are redelivered) → relay, killed once mid-way and restarted → GoChannel
// → receipts inbox. Every order is charged once and every payment produces
// one receipt.
func TestChainInboxOutboxRelayInbox(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a long multi-hop run per database; make test runs it")
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		const orders = 60

		// Billing: inbox + business table + outbox, all in b.db.
		charges := "charges_" + randomSuffix()
		_, err := b.db.Exec(`CREATE TABLE ` + charges + ` (order_id VARCHAR(64) NOT NULL)`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = b.db.Exec(`DROP TABLE ` + charges) })
		inboxTable := "inbox_" + randomSuffix()
		var repo repository.Driver[*sql.Tx]
		switch b.dialect {
		case sqldialect.PostgreSQL:
			r, err := postgres.NewRepository(b.db, postgres.Config{Table: inboxTable})
			require.NoError(t, err)
			require.NoError(t, r.Migrate(ctx))
			repo = r
		case sqldialect.SQLite:
			r, err := sqlite.NewRepository(b.db, sqlite.Config{Table: inboxTable})
			require.NoError(t, err)
			require.NoError(t, r.Migrate(ctx))
			repo = r
		default:
			r, err := mysql.NewRepository(b.db, mysql.Config{Table: inboxTable})
			require.NoError(t, err)
			require.NoError(t, r.Migrate(ctx))
			repo = r
		}
		t.Cleanup(func() { _, _ = b.db.Exec(`DROP TABLE ` + inboxTable) })
		billing, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop", // scope "shop/billing"
			Outputs: b.outbox.Outputs("payments"),
		})
		require.NoError(t, err)

		// Receipts: a second inbox downstream of the relay.
		receipts := newConsumerInbox(t, b)

		pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 256}, watermill.NopLogger{})
		t.Cleanup(func() { require.NoError(t, pubSub.Close()) })
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)

		var (
			mu                      sync.Mutex
			crashed                 = map[string]bool{}
			billingRuns, receiptRun atomic.Int64
			billingDeliveries       atomic.Int64
		)
		router.AddConsumerHandler("billing", "orders", pubSub, func(msg *message.Message) error {
			billingDeliveries.Add(1)
			_, err := billing.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				billingRuns.Add(1)
				tx, err := idempotency.Tx[*sql.Tx](msg.Context())
				if err != nil {
					return nil, err
				}
				if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+charges+` (order_id) VALUES (`+b.ph(1)+`)`, string(msg.Payload)); err != nil {
					return nil, err
				}
				return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("paid "+string(msg.Payload)))}, nil
			})(msg)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			var n int
			_, _ = fmt.Sscanf(msg.UUID, "order-%d", &n)
			if n%5 == 0 && !crashed[msg.UUID] {
				crashed[msg.UUID] = true
				return errors.New("crash after commit, before ack")
			}
			return nil
		})
		router.AddConsumerHandler("receipts", "payments", pubSub, func(msg *message.Message) error {
			receiptRun.Add(1)
			return receipts.consume(msg)
		})
		routerDone := make(chan error, 1)
		go func() { routerDone <- router.Run(ctx) }()
		<-router.Running()
		t.Cleanup(func() {
			require.NoError(t, router.Close())
			require.NoError(t, <-routerDone)
		})

		// The producer retries every third order: the same UUID twice.
		published := 0
		for i := range orders {
			for range 1 + btoi(i%3 == 0) {
				require.NoError(t, pubSub.Publish("orders", message.NewMessage(fmt.Sprintf("order-%d", i), []byte(fmt.Sprintf("o-%d", i)))))
				published++
			}
		}

		// The relay dies after 20 messages (mid-batch) and is restarted.
		cfg := b.relayConfig()
		cfg.BatchSize = 16
		relayCtx, kill := context.WithCancel(ctx)
		crasher := &crashAfter{Publisher: pubSub, n: 20, cancel: kill}
		first, err := b.newRelay(crasher, cfg, testLogger(t))
		require.NoError(t, err)
		firstDone := make(chan error, 1)
		go func() { firstDone <- first.Run(relayCtx) }()
		require.ErrorIs(t, <-firstDone, context.Canceled)
		second, err := b.newRelay(pubSub, cfg, testLogger(t))
		require.NoError(t, err)
		runRelay(t, second)

		deadline := time.Now().Add(30 * time.Second)
		for {
			rows, _ := receipts.effectCount(t)
			if rows >= orders && b.outboxRows(t) == 0 {
				break
			}
			require.True(t, time.Now().Before(deadline), "timed out: %d receipts of %d, %d rows left in the outbox", rows, orders, b.outboxRows(t))
			time.Sleep(5 * time.Millisecond)
		}

		var chargeRows, chargedOrders int
		require.NoError(t, b.db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT order_id) FROM `+charges).Scan(&chargeRows, &chargedOrders))
		rows, distinct := receipts.effectCount(t)
		t.Logf("%s: %d orders published as %d messages; billing: %d deliveries, %d handler runs, %d charges; relay killed after %d; receipts: %d deliveries, %d effects (%d distinct)",
			b.name, orders, published, billingDeliveries.Load(), billingRuns.Load(), chargeRows, crasher.published.Load(), receiptRun.Load(), rows, distinct)
		require.Equal(t, orders, chargeRows, "each order charged once")
		require.Equal(t, orders, chargedOrders)
		require.EqualValues(t, orders, billingRuns.Load())
		require.Equal(t, orders, rows, "one receipt per payment")
		require.Equal(t, orders, distinct)

		// The receipts saw exactly the deterministic payment UUIDs.
		got, err := receipts.db.Query(`SELECT uuid FROM ` + receipts.effects)
		require.NoError(t, err)
		defer got.Close()
		want := map[string]bool{}
		for i := range orders {
			want[middleware.OutputUUID("shop/billing", fmt.Sprintf("order-%d", i), 0)] = true
		}
		for got.Next() {
			var u string
			require.NoError(t, got.Scan(&u))
			require.True(t, want[u], "unexpected payment UUID %s", u)
		}
		require.NoError(t, got.Err())
	})
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
