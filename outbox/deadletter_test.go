package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// refuseLarge stands for a broker with a message size limit, such as
// Kafka's 1 MB message.max.bytes: a Publish call holding a larger
// message fails as a whole, whatever else it holds, with an error marked
// permanent (as RelayConfig.IsPermanent would recognise the broker's).
type refuseLarge struct {
	message.Publisher
	limit   int
	refused atomic.Int64 // Publish calls refused
	calls   atomic.Int64
}

func (p *refuseLarge) Publish(topic string, msgs ...*message.Message) error {
	p.calls.Add(1)
	for _, m := range msgs {
		if len(m.Payload) > p.limit {
			p.refused.Add(1)
			return outbox.Permanent(fmt.Errorf("kafka: message %s too large: %d bytes > %d", m.UUID, len(m.Payload), p.limit))
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

// deadLetterCounter counts what the relay reports.
type deadLetterCounter struct {
	published, deadLettered, failed atomic.Int64
}

func (c *deadLetterCounter) forwardedBatch(s outbox.RelayBatch) {
	c.published.Add(int64(s.Published))
	c.deadLettered.Add(int64(s.DeadLettered))
}
func (c *deadLetterCounter) failedBatch(error) { c.failed.Add(1) }

func (b backend) deadLetters(t *testing.T) *outbox.DeadLetters {
	t.Helper()
	dl, err := b.newDeadLetters()
	require.NoError(t, err)
	return dl
}

// poll calls done until it returns true, failing after timeout.
func poll(t *testing.T, timeout time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// One row the broker always refuses, between 100 good rows before and
// 100 after, written together: the 200 all publish once, the poison row
// is retried, charged MaxAttempts attempts and moved to the dead-letter
// table, and the outbox ends empty. Before the dead-letter path, such a
// row blocked the whole outbox (202 rows, one of 2 MiB: 0 published in
// 5 s).
func TestPoisonRowIsDeadLetteredWhileOthersFlow(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		const maxAttempts = 3
		s := newSink(t, nil, "orders")
		pub := &refuseLarge{Publisher: s, limit: 1 << 20}
		poison := message.NewMessage("poison", bytes.Repeat([]byte{0xff, 0x00}, 1<<20)) // 2 MiB
		poison.Metadata.Set("kind", "oversized")
		b.write(t, "orders", newMessages("before", 100)...)
		b.write(t, "orders", poison)
		b.write(t, "orders", newMessages("after", 100)...)

		m := &deadLetterCounter{}
		cfg := b.relayConfig()
		cfg.MaxAttempts = maxAttempts
		cfg.Observer = m
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)
		start := time.Now()
		runRelay(t, relay)

		s.rec.waitDistinct(t, 200, 30*time.Second)
		allGood := time.Since(start)
		dl := b.deadLetters(t)
		poll(t, 30*time.Second, "the poison row in the dead-letter table", func() bool {
			n, err := dl.Count(context.Background())
			require.NoError(t, err)
			return n == 1
		})
		deadAfter := time.Since(start)
		b.waitEmpty(t, 10*time.Second)

		deliveries, distinct, dups := s.rec.stats()
		require.Equal(t, 200, distinct)
		require.Zero(t, dups)
		require.False(t, s.rec.has("poison"))
		letters, err := dl.List(context.Background(), outbox.ListParams{})
		require.NoError(t, err)
		require.Len(t, letters, 1)
		l := letters[0]
		require.Equal(t, "poison", l.UUID)
		require.Equal(t, "orders", l.Topic)
		require.Equal(t, maxAttempts, l.Attempts)
		require.Contains(t, l.LastError, "too large")
		require.Equal(t, []byte(poison.Payload), l.Payload)
		require.JSONEq(t, `{"kind":"oversized"}`, string(l.Metadata))
		// The relay reports a batch to Metrics after its commit, so the
		// counters may trail the table by one batch.
		poll(t, 10*time.Second, "200 published and 1 dead-lettered in the metrics", func() bool {
			return m.published.Load() == 200 && m.deadLettered.Load() == 1
		})
		require.EqualValues(t, 200, m.published.Load())
		require.EqualValues(t, 1, m.deadLettered.Load())
		t.Logf("%s: 201 rows, one of 2 MiB refused by the publisher (limit 1 MiB): %d delivered (%d distinct, %d duplicates) %s after relay start; poison row dead-lettered after %d attempts at %s; %d Publish calls, %d refused; outbox empty",
			b.name, deliveries, distinct, dups, allGood.Round(time.Millisecond), l.Attempts, deadAfter.Round(time.Millisecond), pub.calls.Load(), pub.refused.Load())
	})
}

// Metadata that is valid JSON but not an object of strings can never be
// published: the row is dead-lettered in the first batch, with 0
// attempts, and the rows around it are published by that same batch.
func TestUndecodableMetadataIsDeadLetteredAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := newSink(t, nil, "t")
		b.write(t, "t", message.NewMessage("good-1", []byte("1")))
		for i, md := range []string{`{"n": 1}`, `[1, 2]`} {
			_, err := b.db.Exec(`INSERT INTO `+b.table+` (topic, uuid, payload, metadata) VALUES (`+b.ph(1)+`, `+b.ph(2)+`, `+b.ph(3)+`, `+b.ph(4)+`)`,
				"t", fmt.Sprintf("bad-%d", i), []byte{0x00}, md)
			require.NoError(t, err)
		}
		b.write(t, "t", message.NewMessage("good-2", []byte("2")))

		m := &deadLetterCounter{}
		cfg := b.relayConfig()
		cfg.Observer = m
		relay, err := b.newRelay(s, cfg, testLogger(t))
		require.NoError(t, err)
		n, err := relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Zero(t, b.outboxRows(t))
		require.True(t, s.rec.has("good-1"))
		require.True(t, s.rec.has("good-2"))
		require.EqualValues(t, 2, m.deadLettered.Load())

		letters, err := b.deadLetters(t).List(ctx, outbox.ListParams{})
		require.NoError(t, err)
		require.Len(t, letters, 2)
		for i, l := range letters {
			require.Equal(t, fmt.Sprintf("bad-%d", i), l.UUID)
			require.Zero(t, l.Attempts)
			require.Contains(t, l.LastError, "metadata is not a JSON object of strings")
		}
		require.JSONEq(t, `{"n": 1}`, string(letters[0].Metadata))
		require.JSONEq(t, `[1, 2]`, string(letters[1].Metadata))
	})
}

// refuseUUIDs refuses any Publish call holding a message whose UUID
// starts with "poison" while refusing is set.
type refuseUUIDs struct {
	message.Publisher
	refusing atomic.Bool
}

func (p *refuseUUIDs) Publish(topic string, msgs ...*message.Message) error {
	if p.refusing.Load() {
		for _, m := range msgs {
			if strings.HasPrefix(m.UUID, "poison") {
				return errors.New("refused \xff\x00 invalid bytes in the error")
			}
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

// The operator API: list, requeue (atomically, once under concurrency,
// attempts reset, message unchanged) and delete dead letters.
func TestDeadLettersListRequeueDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := newSink(t, nil, "t")
		pub := &refuseUUIDs{Publisher: s}
		pub.refusing.Store(true)
		p1 := message.NewMessage("poison-1", []byte{0x00, 0x01})
		p1.Metadata.Set("k", "v1")
		p2 := message.NewMessage("poison-2", []byte{0x02})
		b.write(t, "t", message.NewMessage("good-1", nil), p1, message.NewMessage("good-2", nil), p2)
		cfg := b.relayConfig()
		cfg.MaxAttempts = 1
		cfg.MinRefusalSpan = time.Nanosecond // the refusals are unknown errors: no wait for the span
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)

		// Batch 1 fails as a whole; batch 2 isolates: the good rows go,
		// each poison row fails alone and reaches MaxAttempts.
		n, err := relay.ForwardBatch(ctx)
		require.Error(t, err)
		require.Zero(t, n)
		n, err = relay.ForwardBatch(ctx)
		require.Error(t, err)
		require.Equal(t, 2, n)
		require.Zero(t, b.outboxRows(t))

		dl := b.deadLetters(t)
		all, err := dl.List(ctx, outbox.ListParams{})
		require.NoError(t, err)
		require.Len(t, all, 2)
		require.Equal(t, []string{"poison-1", "poison-2"}, []string{all[0].UUID, all[1].UUID})
		for _, l := range all {
			require.Equal(t, 1, l.Attempts)
			require.Contains(t, l.LastError, "refused \uFFFD invalid bytes", "stored as valid UTF-8 without NUL")
			require.WithinDuration(t, time.Now(), l.DeadLetteredAt, time.Minute)
			require.False(t, l.CreatedAt.After(l.DeadLetteredAt))
		}
		page, err := dl.List(ctx, outbox.ListParams{Limit: 1})
		require.NoError(t, err)
		require.Equal(t, []int64{all[0].ID}, []int64{page[0].ID})
		page, err = dl.List(ctx, outbox.ListParams{AfterID: all[0].ID})
		require.NoError(t, err)
		require.Len(t, page, 1)
		require.Equal(t, all[1].ID, page[0].ID)
		page, err = dl.List(ctx, outbox.ListParams{Topic: "other"})
		require.NoError(t, err)
		require.Empty(t, page)
		_, err = dl.List(ctx, outbox.ListParams{Limit: outbox.MaxDeadLetterIDs + 1})
		require.ErrorIs(t, err, outbox.ErrInvalidParams)

		// Two operators requeue the same dead letter at once: one moves it.
		var wg sync.WaitGroup
		var moved atomic.Int64
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := dl.Requeue(ctx, all[0].ID)
				if err != nil {
					t.Error(err)
				}
				moved.Add(int64(n))
			}()
		}
		wg.Wait()
		require.EqualValues(t, 1, moved.Load())
		count, err := dl.Count(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, count)
		var attempts int
		require.NoError(t, b.db.QueryRow(`SELECT attempts FROM `+b.table).Scan(&attempts))
		require.Zero(t, attempts, "attempts reset")

		// The broker accepts it now: same UUID, payload and metadata.
		pub.refusing.Store(false)
		n, err = relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		got := s.rec.deliveries()
		last := got[len(got)-1].msg
		require.Equal(t, "poison-1", last.UUID)
		require.Equal(t, []byte(p1.Payload), []byte(last.Payload))
		require.Equal(t, "v1", last.Metadata.Get("k"))

		n, err = dl.Requeue(ctx, all[0].ID, 1<<40)
		require.NoError(t, err)
		require.Zero(t, n, "already requeued, unknown id")
		_, err = dl.Requeue(ctx, make([]int64, outbox.MaxDeadLetterIDs+1)...)
		require.ErrorIs(t, err, outbox.ErrInvalidParams)

		n, err = dl.Delete(ctx, all[1].ID)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		n, err = dl.Delete(ctx, all[1].ID)
		require.NoError(t, err)
		require.Zero(t, n)
		count, err = dl.Count(ctx)
		require.NoError(t, err)
		require.Zero(t, count)
	})
}

// failAll refuses every Publish while down is set.
type failAll struct {
	message.Publisher
	down  atomic.Bool
	calls atomic.Int64
}

func (p *failAll) Publish(topic string, msgs ...*message.Message) error {
	if p.down.Load() {
		p.calls.Add(1)
		return errors.New("broker unreachable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// A publisher outage charges nothing: no row reaches MaxAttempts however
// many batches fail, and everything is published once it is back.
func TestPublisherOutageChargesNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := newSink(t, nil, "t")
		pub := &failAll{Publisher: s}
		pub.down.Store(true)
		b.write(t, "t", newMessages("m", 64)...)
		cfg := b.relayConfig()
		cfg.MaxAttempts = 1
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)
		const batches = 5
		for range batches {
			n, err := relay.ForwardBatch(ctx)
			require.Error(t, err)
			require.Zero(t, n)
		}
		var maxAttempts int
		require.NoError(t, b.db.QueryRow(`SELECT MAX(attempts) FROM `+b.table).Scan(&maxAttempts))
		require.Zero(t, maxAttempts)
		count, err := b.deadLetters(t).Count(ctx)
		require.NoError(t, err)
		require.Zero(t, count)
		t.Logf("%s: %d failed batches over 64 rows cost %d Publish calls (the first batch 1, each isolating batch about log2(64)+2)", b.name, batches, pub.calls.Load())

		pub.down.Store(false)
		n, err := relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 64, n)
		_, distinct, dups := s.rec.stats()
		require.Equal(t, 64, distinct)
		require.Zero(t, dups)
	})
}

func TestDeadLetterTableName(t *testing.T) {
	require.Equal(t, "watermill_outbox_dead_letters", outbox.DeadLetterTableName(outbox.DefaultTableName))
	require.Equal(t, "app.orders_outbox_dead_letters", outbox.DeadLetterTableName("app.orders_outbox"))
	long := strings.Repeat("a", 63)
	for _, table := range []string{long, "s." + long, strings.Repeat("b", 50), long[:62] + "x"} {
		name := outbox.DeadLetterTableName(table)
		require.NoError(t, repository.ValidateTableName(name), table)
		require.NotEqual(t, table, name)
	}
	require.NotEqual(t, outbox.DeadLetterTableName(long), outbox.DeadLetterTableName(long[:62]+"x"), "hashed names differ")
}

func TestRelayConfigValidatesNewLimits(t *testing.T) {
	err := outbox.RelayConfig{Dialect: sqldialect.MySQL, MaxBatchBytes: -1, MaxAttempts: -1, CloseTimeout: -time.Second}.Validate()
	require.ErrorContains(t, err, "RelayConfig.MaxBatchBytes must be positive")
	require.ErrorContains(t, err, "RelayConfig.MaxAttempts must be positive")
	require.ErrorContains(t, err, "RelayConfig.CloseTimeout must be positive")
}

// ObserveRelayBatch makes deadLetterCounter a RelayObserver.
func (c *deadLetterCounter) ObserveRelayBatch(_ context.Context, b outbox.RelayBatch) {
	splitBatch(b, c.forwardedBatch, c.failedBatch)
}
