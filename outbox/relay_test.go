package outbox_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Eight writers whose transactions commit out of order: writer 0 takes the
// lowest id and commits only after the relay has published every message
// of the other seven (all with higher ids). An id-offset reader would
// have moved past writer 0's id; the relay must still deliver it.
//
// SQLite cannot commit out of order (see sqliteCommitsInIDOrder), so it
// runs the test's SQLite counterpart.
func TestOutOfOrderCommitsAreNotSkipped(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hundreds of messages per database; make test runs it")
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		if b.dialect == sqldialect.SQLite {
			sqliteCommitsInIDOrder(t, b)
			return
		}
		ctx := context.Background()
		const writers, txPerWriter, msgsPerTx = 8, 10, 5
		s, relay := newOrdersRelay(t, b)

		// Writer 0: open a transaction holding the lowest id.
		long, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = long.Rollback() }()
		early := message.NewMessage("writer0-early", []byte{0x00})
		require.NoError(t, b.outbox.WriteTx(ctx, long, outbox.Outgoing{Topic: "orders", Message: early}))
		var earlyID int64
		require.NoError(t, long.QueryRowContext(ctx, `SELECT MAX(id) FROM `+b.table).Scan(&earlyID))

		runRelay(t, relay)

		// Writers 1..7 race; their commits interleave in any order.
		writeConcurrently(t, b, writers, txPerWriter, msgsPerTx).Wait()
		others := (writers - 1) * txPerWriter * msgsPerTx
		s.rec.waitDistinct(t, others, 30*time.Second)
		require.False(t, s.rec.has(early.UUID), "uncommitted message must not be published")

		// The relay has published every later id; now the early one commits.
		require.NoError(t, b.outbox.WriteTx(ctx, long, outbox.Outgoing{Topic: "orders", Message: message.NewMessage("writer0-late", []byte{0x01})}))
		require.NoError(t, long.Commit())
		total := others + 2
		s.rec.waitDistinct(t, total, 30*time.Second)

		deliveries, distinct, dups := s.rec.stats()
		got := s.rec.deliveries()
		require.Equal(t, "writer0-early", got[len(got)-2].msg.UUID, "the late transaction's messages come last, in insertion order")
		require.Equal(t, "writer0-late", got[len(got)-1].msg.UUID)
		t.Logf("%s: %d writers committed %d messages out of order; writer 0 held id %d and committed after %d higher ids were published; delivered %d, distinct %d, skipped %d, duplicates %d",
			b.name, writers, total, earlyID, others, deliveries, distinct, total-distinct, dups)
		require.Equal(t, total, distinct)
		require.Zero(t, dups)
	})
}

// sqliteCommitsInIDOrder is why SQLite's relay needs no SKIP LOCKED and
// cannot skip a late commit: while a writer's transaction is open (BEGIN
// IMMEDIATE takes the write lock), no other writer, and no relay, can
// begin, so ids are handed out in commit order. Writer 0 holds its
// transaction while seven writers and the relay queue behind it; every
// message arrives once, writer 0's first, all in id order.
func sqliteCommitsInIDOrder(t *testing.T, b backend) {
	ctx := context.Background()
	const writers, txPerWriter, msgsPerTx = 8, 10, 5
	s, relay := newOrdersRelay(t, b)

	long, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = long.Rollback() }()
	require.NoError(t, b.outbox.WriteTx(ctx, long, outbox.Outgoing{Topic: "orders", Message: message.NewMessage("writer0-early", []byte{0x00})}))

	// A second writer that does not wait is refused at once.
	conn, err := b.db.Conn(ctx)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, `PRAGMA busy_timeout = 0`)
	require.NoError(t, err)
	_, err = conn.BeginTx(ctx, nil)
	require.ErrorContains(t, err, "locked", "a second writer began while the first was open")
	_, err = conn.ExecContext(ctx, `PRAGMA busy_timeout = 5000`)
	require.NoError(t, err)
	require.NoError(t, conn.Close())

	runRelay(t, relay)
	wg := writeConcurrently(t, b, writers, txPerWriter, msgsPerTx)
	require.NoError(t, b.outbox.WriteTx(ctx, long, outbox.Outgoing{Topic: "orders", Message: message.NewMessage("writer0-late", []byte{0x01})}))
	require.NoError(t, long.Commit())
	wg.Wait()
	total := (writers-1)*txPerWriter*msgsPerTx + 2
	s.rec.waitDistinct(t, total, 30*time.Second)
	b.waitEmpty(t, 10*time.Second)

	deliveries, distinct, dups := s.rec.stats()
	got := s.rec.deliveries()
	require.Equal(t, "writer0-early", got[0].msg.UUID)
	require.Equal(t, "writer0-late", got[1].msg.UUID)
	t.Logf("%s: a second writer was refused while writer 0 was open; %d writers committed %d messages; delivered %d, distinct %d, duplicates %d",
		b.name, writers, total, deliveries, distinct, dups)
	require.Equal(t, total, distinct)
	require.Zero(t, dups)
}

// newOrdersRelay returns a sink for "orders" and a fast-polling relay of
// b's outbox into it, batches of 50.
func newOrdersRelay(t *testing.T, b backend) (*sink, *outbox.Relay) {
	s := newSink(t, nil, "orders")
	cfg := b.relayConfig()
	cfg.PollInterval = 10 * time.Millisecond
	cfg.BatchSize = 50
	relay, err := b.newRelay(s, cfg, testLogger(t))
	require.NoError(t, err)
	return s, relay
}

// writeConcurrently starts writers 1..writers-1, each committing
// txPerWriter transactions of msgsPerTx messages to "orders".
func writeConcurrently(t *testing.T, b backend, writers, txPerWriter, msgsPerTx int) *sync.WaitGroup {
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := 1; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range txPerWriter {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					t.Error(err)
					return
				}
				out := make([]outbox.Outgoing, msgsPerTx)
				for k := range out {
					m := message.NewMessage(fmt.Sprintf("w%d-t%d-m%d", w, i, k), []byte{byte(w), 0x00, byte(k)})
					m.Metadata.Set("writer", strconv.Itoa(w))
					out[k] = outbox.Outgoing{Topic: "orders", Message: m}
				}
				if err := b.outbox.WriteTx(ctx, tx, out...); err != nil {
					t.Error(err)
					_ = tx.Rollback()
					return
				}
				if err := tx.Commit(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	return &wg
}

// crashAfter publishes, and once it has published at least n messages it
// cancels the relay's context: the relay dies after publishing a batch and
// before acknowledging it, the worst moment.
type crashAfter struct {
	message.Publisher
	n         int64
	published atomic.Int64
	cancel    context.CancelFunc
}

func (p *crashAfter) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if p.published.Add(int64(len(msgs))) >= p.n {
		p.cancel()
	}
	return nil
}

// The relay is killed mid-batch and restarted: every message arrives, the
// repeats carry the same UUIDs, and a downstream inbox applies each
// effect once.
func TestRelayKilledMidBatchAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hundreds of messages per database; make test runs it")
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		const total, batch = 400, 50
		consumer := newConsumerInbox(t, b)
		s := newSink(t, consumer.consume, "payments")
		written := map[string]bool{}
		for i := range total / 100 {
			msgs := newMessages("pay"+strconv.Itoa(i), 100)
			for _, m := range msgs {
				written[m.UUID] = true
			}
			b.write(t, "payments", msgs...)
		}

		// First relay: dies after publishing its third batch, before its ack.
		cfg := b.relayConfig()
		cfg.BatchSize = batch
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		crasher := &crashAfter{Publisher: s, n: 2*batch + 1, cancel: cancel}
		first, err := b.newRelay(crasher, cfg, testLogger(t))
		require.NoError(t, err)
		require.ErrorIs(t, first.Run(ctx), context.Canceled)
		left := b.outboxRows(t)
		require.Equal(t, total-2*batch, left, "the third batch was published but not acknowledged")
		deliveredBeforeRestart, _, _ := s.rec.stats()

		// Restart: a new relay finishes the job.
		second, err := b.newRelay(s, cfg, testLogger(t))
		require.NoError(t, err)
		runRelay(t, second)
		s.rec.waitDistinct(t, total, 30*time.Second)

		deliveries, distinct, dups := s.rec.stats()
		for _, d := range s.rec.deliveries() {
			require.True(t, written[d.msg.UUID], "delivered UUID %s was never written", d.msg.UUID)
		}
		rows, distinctEffects := consumer.effectCount(t)
		t.Logf("%s: wrote %d; relay killed after publishing %d (%d unacknowledged rows left); after restart delivered %d (distinct %d, duplicates %d, all with original UUIDs); downstream inbox applied %d effects (%d distinct)",
			b.name, total, deliveredBeforeRestart, left, deliveries, distinct, dups, rows, distinctEffects)
		require.Equal(t, total, distinct)
		require.Equal(t, batch, dups, "exactly the unacknowledged batch is published twice")
		require.Equal(t, total, rows, "each effect once")
		require.Equal(t, total, distinctEffects)
		b.waitEmpty(t, 10*time.Second)
	})
}

// Several relays on one table while writers keep writing: every message
// is delivered, and SKIP LOCKED keeps them from publishing a row twice.
func TestSeveralRelaysConcurrently(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hundreds of messages per database; make test runs it")
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		const relays, writers, perWriter = 3, 4, 250
		s := newSink(t, nil, "events")
		cfg := b.relayConfig()
		cfg.PollInterval = 10 * time.Millisecond
		cfg.BatchSize = 20
		var metrics [relays]relayCounter
		for i := range relays {
			cfg.Observer = &metrics[i]
			r, err := b.newRelay(s, cfg, testLogger(t))
			require.NoError(t, err)
			runRelay(t, r)
		}
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perWriter; i += 10 {
					msgs := make([]*message.Message, 10)
					for k := range msgs {
						msgs[k] = message.NewMessage(fmt.Sprintf("w%d-%d", w, i+k), []byte{0x00})
					}
					b.write(t, "events", msgs...)
				}
			}()
		}
		wg.Wait()
		total := writers * perWriter
		s.rec.waitDistinct(t, total, 30*time.Second)
		deliveries, distinct, dups := s.rec.stats()
		per := make([]int64, relays)
		for i := range metrics {
			per[i] = metrics[i].published.Load()
		}
		t.Logf("%s: %d relays, %d messages written concurrently; delivered %d, distinct %d, duplicates %d; published per relay %v",
			b.name, relays, total, deliveries, distinct, dups, per)
		require.Equal(t, total, distinct)
		require.Zero(t, dups, "no relay crashed, so no row may be published twice")
	})
}

type relayCounter struct{ published atomic.Int64 }

func (c *relayCounter) forwardedBatch(s outbox.RelayBatch) { c.published.Add(int64(s.Published)) }
func (c *relayCounter) failedBatch(error)                  {}

// With polling effectively off, NOTIFY alone wakes the relay.
func TestNotifyWakesRelay(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		if b.dialect != sqldialect.PostgreSQL {
			t.Skip("LISTEN/NOTIFY is PostgreSQL only; MariaDB polls")
		}
		s := newSink(t, nil, "t")
		cfg := b.relayConfig()
		cfg.PollInterval = time.Hour
		relay, err := b.newRelay(s, cfg, testLogger(t))
		require.NoError(t, err)
		runRelay(t, relay)
		for i := range 3 {
			start := time.Now()
			b.write(t, "t", message.NewMessage("notify-"+strconv.Itoa(i), nil))
			s.rec.waitDistinct(t, i+1, 10*time.Second)
			t.Logf("message %d published %s after commit (poll interval 1h)", i, time.Since(start))
		}
	})
}

func TestRunAndCloseLifecycle(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		s := newSink(t, nil, "t")
		relay, err := b.newRelay(s, b.relayConfig(), testLogger(t))
		require.NoError(t, err)

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- relay.Run(ctx) }()
		b.write(t, "t", message.NewMessage("m1", nil))
		s.rec.waitDistinct(t, 1, 10*time.Second)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled, "Run returns the context's error")

		// Run again after a cancelled context, then Close.
		go func() { done <- relay.Run(context.Background()) }()
		b.write(t, "t", message.NewMessage("m2", nil))
		s.rec.waitDistinct(t, 2, 10*time.Second)
		require.Error(t, relay.Run(context.Background()), "second concurrent Run")
		require.NoError(t, relay.Close())
		require.NoError(t, <-done, "Run returns nil after Close")
		require.NoError(t, relay.Close(), "Close is idempotent")
		require.ErrorIs(t, relay.Run(context.Background()), outbox.ErrRelayClosed)
	})
}

// End to end: a producer's transaction writes an order and its event;
// the relay forwards to a GoChannel; a router consumer with an inbox
// applies the effect. Duplicates are injected at both hops: the producer
// writes some events twice (a retried request) and the relay is killed
// once after publishing and before acknowledging.
func TestEndToEndThroughGoChannel(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hundreds of messages per database; make test runs it")
	}
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		const orders = 120
		orderTable := "orders_" + randomSuffix()
		_, err := b.db.Exec(`CREATE TABLE ` + orderTable + ` (id VARCHAR(64) NOT NULL)`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = b.db.Exec(`DROP TABLE ` + orderTable) })

		produce := func(i int) {
			tx, err := b.db.BeginTx(ctx, nil)
			require.NoError(t, err)
			id := fmt.Sprintf("order-%03d", i)
			_, err = tx.ExecContext(ctx, `INSERT INTO `+orderTable+` (id) VALUES (`+b.ph(1)+`)`, id)
			require.NoError(t, err)
			// A deterministic UUID: a retried request produces the same one.
			require.NoError(t, b.outbox.InTx(tx).Publish("orders.placed", message.NewMessage("evt-"+id, []byte(id))))
			require.NoError(t, tx.Commit())
		}
		for i := range orders {
			produce(i)
			if i%4 == 0 {
				produce(i) // the retried request: same event UUID, second order row
			}
		}

		// Consumer: router + GoChannel + inbox.
		consumer := newConsumerInbox(t, b)
		pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		var handled, applied, received atomic.Int64
		allDone := make(chan struct{})
		router.AddConsumerHandler("billing", "orders.placed", pubSub, func(msg *message.Message) error {
			received.Add(1)
			ran := false
			_, err := consumer.inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				ran = true
				handled.Add(1)
				return consumer.handler(msg)
			})(msg)
			if err == nil && ran && applied.Add(1) == orders {
				close(allDone) // the last effect committed
			}
			return err
		})
		routerDone := make(chan error, 1)
		go func() { routerDone <- router.Run(ctx) }()
		<-router.Running()
		defer func() {
			require.NoError(t, router.Close())
			require.NoError(t, <-routerDone)
			require.NoError(t, pubSub.Close())
		}()

		cfg := b.relayConfig()
		cfg.BatchSize = 25
		relayCtx, kill := context.WithCancel(ctx)
		crasher := &crashAfter{Publisher: pubSub, n: 40, cancel: kill}
		first, err := b.newRelay(crasher, cfg, testLogger(t))
		require.NoError(t, err)
		require.ErrorIs(t, first.Run(relayCtx), context.Canceled)
		second, err := b.newRelay(pubSub, cfg, testLogger(t))
		require.NoError(t, err)
		runRelay(t, second)

		select {
		case <-allDone:
		case <-time.After(30 * time.Second):
			t.Fatalf("timed out: %d effects of %d", applied.Load(), orders)
		}
		rows, distinct := consumer.effectCount(t)
		written := orders + (orders+3)/4
		t.Logf("%s: %d orders, %d events written (producer retries), relay killed once; consumer received %d deliveries, handler ran %d times, %d effects (%d distinct)",
			b.name, orders, written, received.Load(), handled.Load(), rows, distinct)
		require.Equal(t, orders, rows)
		require.Equal(t, orders, distinct)
		require.EqualValues(t, orders, handled.Load())
	})
}

// ObserveRelayBatch makes relayCounter a RelayObserver.
func (c *relayCounter) ObserveRelayBatch(_ context.Context, b outbox.RelayBatch) {
	splitBatch(b, c.forwardedBatch, c.failedBatch)
}
