package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// Errors a Kafka producer returns (sarama's texts) that the relay cannot
// classify: RelayConfig.IsPermanent is left at its default.
var (
	errLeaderElection = errors.New("kafka server: In the middle of a leadership election, there is currently no leader for this partition and hence it is unavailable for writes")
	errTooLarge       = errors.New("kafka server: Message was too large, server rejected it to avoid allocation error")
)

// topicScript is a publisher scripted per topic: while a topic is down,
// every Publish call to it fails with the topic's error; a call holding
// a message whose UUID starts with "poison" fails with poisonErr; every
// other call goes to the wrapped publisher.
type topicScript struct {
	message.Publisher
	poisonErr error

	mu       sync.Mutex
	down     map[string]error
	refused  map[string]int       // failed calls, by topic
	firstTry map[string]time.Time // by UUID, when the first failed call holding it began
}

func newTopicScript(pub message.Publisher, poisonErr error) *topicScript {
	return &topicScript{Publisher: pub, poisonErr: poisonErr, down: map[string]error{}, refused: map[string]int{}, firstTry: map[string]time.Time{}}
}

func (p *topicScript) Publish(topic string, msgs ...*message.Message) error {
	began := time.Now()
	p.mu.Lock()
	err := p.down[topic]
	for _, m := range msgs {
		if err == nil && strings.HasPrefix(m.UUID, "poison") {
			err = p.poisonErr
		}
	}
	if err != nil {
		p.refused[topic]++
		for _, m := range msgs {
			if _, ok := p.firstTry[m.UUID]; !ok {
				p.firstTry[m.UUID] = began
			}
		}
	}
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return p.Publisher.Publish(topic, msgs...)
}

func (p *topicScript) setDown(topic string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down[topic] = err
}

func (p *topicScript) refusedCalls(topic string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused[topic]
}

func (p *topicScript) firstRefused(t *testing.T, uuid string) time.Time {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.firstTry[uuid]
	require.True(t, ok, "%s was never refused", uuid)
	return at
}

// reportSums sums what the relay reports.
type reportSums struct {
	published, deadLettered, moveFailures, failed atomic.Int64
}

func (c *reportSums) ObserveRelayBatch(_ context.Context, b outbox.RelayBatch) {
	c.published.Add(int64(b.Published))
	c.deadLettered.Add(int64(b.DeadLettered))
	c.moveFailures.Add(int64(b.DeadLetterFailures))
	if b.Err != nil {
		c.failed.Add(1)
	}
}

// deadLetterCount counts b's dead-letter table.
func (b backend) deadLetterCount(t *testing.T) int {
	t.Helper()
	n, err := b.deadLetters(t).Count(context.Background())
	require.NoError(t, err)
	return n
}

// attemptsOf returns the attempts column of the outbox row uuid.
func (b backend) attemptsOf(t *testing.T, uuid string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(`SELECT attempts FROM `+b.table+` WHERE uuid = `+b.ph(1), uuid).Scan(&n))
	return n
}

// Issue 36, finding 1: topic "invoices" refuses everything with an
// error the relay cannot classify (a leader election) while "orders"
// keeps flowing. Before, every batch that published an order charged the
// refused invoices, so the outage dead-lettered them (measured: 20 of 20
// invoices after a 4 s outage, 0 published). The outage lasts here for
// 20 orders, each published while every invoice so far is refused, with
// MaxAttempts 3 and no MinRefusalSpan to wait for: nothing is charged or
// dead-lettered, and once the topic is back every invoice is published
// once.
func TestTopicOutageWhileAnotherFlowsDeadLettersNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		const n = 20
		s := newSink(t, nil, "orders", "invoices")
		pub := newTopicScript(s, nil)
		pub.setDown("invoices", errLeaderElection)
		counter := &reportSums{}
		cfg := b.relayConfig()
		cfg.MaxAttempts = 3
		cfg.MinRefusalSpan = time.Nanosecond // the per-topic rule alone protects the invoices
		cfg.PollInterval, cfg.MaxRetryInterval = 10*time.Millisecond, 100*time.Millisecond
		cfg.Observer = counter
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)
		start := time.Now()
		runRelay(t, relay)

		for i := range n {
			b.write(t, "invoices", message.NewMessage(fmt.Sprintf("inv-%02d", i), []byte{byte(i)}))
			b.write(t, "orders", message.NewMessage(fmt.Sprintf("ord-%02d", i), []byte{byte(i)}))
			s.rec.waitDistinct(t, i+1, 30*time.Second) // the order, while every invoice so far is refused
		}
		// An order is recorded before its batch commits: wait for the
		// commit, and for the relay to retry the invoices some more.
		poll(t, 30*time.Second, "the orders acknowledged and the invoices retried", func() bool {
			return b.outboxRows(t) <= n && pub.refusedCalls("invoices") >= 2*n
		})
		outage := time.Since(start)
		require.Zero(t, b.deadLetterCount(t), "an invoices outage dead-lettered invoices while orders flowed")
		require.Equal(t, n, b.outboxRows(t), "the invoices wait in the outbox")
		var maxAttempts int
		require.NoError(t, b.db.QueryRow(`SELECT MAX(attempts) FROM `+b.table).Scan(&maxAttempts))
		require.Zero(t, maxAttempts, "no invoice charged")
		for _, d := range s.rec.deliveries() {
			require.Equal(t, "orders", d.topic)
		}

		pub.setDown("invoices", nil)
		s.rec.waitDistinct(t, 2*n, 30*time.Second)
		b.waitEmpty(t, 10*time.Second)
		_, distinct, dups := s.rec.stats()
		require.Equal(t, 2*n, distinct)
		require.Zero(t, dups)
		require.Zero(t, b.deadLetterCount(t))
		t.Logf("%s: invoices down %s (%d refused calls) while %d orders flowed: 0 charged, 0 dead-lettered; after recovery %d invoices and %d orders published once each",
			b.name, outage.Round(time.Millisecond), pub.refusedCalls("invoices"), n, n, n)
	})
}

// Issue 36: a poison row refused with an error the relay cannot classify
// (Kafka's "Message was too large" without a custom IsPermanent). Written
// alone, it is not charged: nothing tells it from an outage of its topic.
// Then its topic accepts other rows — fewer than MaxAttempts, one at a
// time — so the row is charged on every retry and dead-lettered after
// MaxAttempts. Before, it was charged only in a batch that also
// published another row, once per such row, and never reached
// MaxAttempts.
func TestLoneRowIsDeadLetteredWhileItsTopicAcceptsOthers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		const maxAttempts = 4
		s := newSink(t, nil, "orders")
		pub := newTopicScript(s, errTooLarge)
		cfg := b.relayConfig()
		cfg.MaxAttempts = maxAttempts
		cfg.MinRefusalSpan = time.Nanosecond // MaxAttempts alone decides here
		cfg.PollInterval, cfg.MaxRetryInterval = 10*time.Millisecond, 100*time.Millisecond
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)
		b.write(t, "orders", message.NewMessage("poison", []byte("2 MB")))
		runRelay(t, relay)

		poll(t, 30*time.Second, "the lone row refused 3 times", func() bool { return pub.refusedCalls("orders") >= 3 })
		require.Zero(t, b.attemptsOf(t, "poison"), "alone, its refusals are not charged")

		for i := range maxAttempts - 1 {
			b.write(t, "orders", message.NewMessage(fmt.Sprintf("good-%d", i), []byte{byte(i)}))
			s.rec.waitDistinct(t, i+1, 30*time.Second)
		}
		poll(t, 30*time.Second, "the poison row in the dead-letter table", func() bool { return b.deadLetterCount(t) == 1 })
		b.waitEmpty(t, 10*time.Second)
		letters, err := b.deadLetters(t).List(context.Background(), outbox.ListParams{})
		require.NoError(t, err)
		require.Len(t, letters, 1)
		require.Equal(t, "poison", letters[0].UUID)
		require.Equal(t, maxAttempts, letters[0].Attempts)
		require.Contains(t, letters[0].LastError, "Message was too large")
		_, distinct, dups := s.rec.stats()
		require.Equal(t, maxAttempts-1, distinct)
		require.Zero(t, dups)
		t.Logf("%s: a lone row refused with an unknown error, %d other rows of its topic accepted: dead-lettered after %d attempts, %d refused calls",
			b.name, maxAttempts-1, letters[0].Attempts, pub.refusedCalls("orders"))
	})
}

// Issue 36, the item left open: a poison row refused with an unknown
// error after every other row of its batch and topic went out, on a
// topic that then stays quiet. Its topic accepted rows after it was first
// refused, so it is charged on each retry; at MaxAttempts it waits,
// uncharged, until its refusals span MinRefusalSpan, and is then
// dead-lettered. Before, it was charged in the batch that published the
// others and never again: it stayed in the outbox for ever. (A row whose
// topic accepted nothing since its first refusal is never charged: see
// TestQuietUnknownRefusalsBackOff.)
func TestQuietTopicPoisonRowIsDeadLetteredAfterMinRefusalSpan(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		const maxAttempts, span = 2, 500 * time.Millisecond
		s := newSink(t, nil, "orders")
		pub := newTopicScript(s, errTooLarge)
		cfg := b.relayConfig()
		cfg.MaxAttempts = maxAttempts
		cfg.MinRefusalSpan = span
		cfg.PollInterval, cfg.MaxRetryInterval = 10*time.Millisecond, 100*time.Millisecond
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)
		msgs := newMessages("good", 5)
		msgs = append(msgs[:2], append([]*message.Message{message.NewMessage("poison", []byte("2 MB"))}, msgs[2:]...)...)
		b.write(t, "orders", msgs...)
		runRelay(t, relay)

		s.rec.waitDistinct(t, 5, 30*time.Second)
		poll(t, 30*time.Second, "the poison row in the dead-letter table", func() bool { return b.deadLetterCount(t) == 1 })
		// The relay stamps the first refusal after that call returned and
		// decides after the last one, before its commit: the span it
		// waited lies within this window.
		waited := time.Since(pub.firstRefused(t, "poison"))
		require.GreaterOrEqual(t, waited, span, "dead-lettered before its refusals spanned MinRefusalSpan")
		b.waitEmpty(t, 10*time.Second)
		letters, err := b.deadLetters(t).List(context.Background(), outbox.ListParams{})
		require.NoError(t, err)
		require.Len(t, letters, 1)
		require.Equal(t, "poison", letters[0].UUID)
		require.Equal(t, maxAttempts, letters[0].Attempts, "not charged while it waited for the span")
		_, distinct, dups := s.rec.stats()
		require.Equal(t, 5, distinct)
		require.Zero(t, dups)
		t.Logf("%s: a poison row left alone on a quiet topic, unknown error, MaxAttempts %d, MinRefusalSpan %s: dead-lettered %s after its first refusal, %d refused calls",
			b.name, maxAttempts, span, waited.Round(time.Millisecond), pub.refusedCalls("orders"))
	})
}

// Issue 36, finding 2: with the dead-letter table unwritable (dropped
// here; a full disk or a revoked grant fails the same way), a row due
// for it made the whole batch roll back, its published rows with it:
// they were published again and again and the outbox never drained
// (measured: 29 good rows published 13 times each in 5 s, all 30 rows
// left). Now the failed move is undone alone: every good row is
// published once and deleted, also under steady traffic afterwards, the
// refused row stays in the outbox, and the failures are counted in
// RelayBatch.DeadLetterFailures and logged once, not once per batch.
func TestUnwritableDeadLetterTableKeepsDrainingGoodRows(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		const before, steady = 29, 20
		s := newSink(t, nil, "orders")
		pub := newTopicScript(s, outbox.Permanent(errors.New("message too large")))
		msgs := newMessages("good", before)
		msgs = append(msgs[:before/2], append([]*message.Message{message.NewMessage("poison", []byte("2 MB"))}, msgs[before/2:]...)...)
		b.write(t, "orders", msgs...)
		_, err := b.db.Exec(`DROP TABLE ` + outbox.DeadLetterTableName(b.table))
		require.NoError(t, err)

		counter := &reportSums{}
		logs := watermill.NewCaptureLogger()
		cfg := b.relayConfig()
		cfg.MaxAttempts = 1
		cfg.PollInterval = 10 * time.Millisecond
		cfg.Observer = counter
		relay, err := b.newRelay(pub, cfg, logs)
		require.NoError(t, err)
		start := time.Now()
		runRelay(t, relay)

		s.rec.waitDistinct(t, before, 30*time.Second)
		poll(t, 30*time.Second, "the good rows deleted and 3 failed moves", func() bool {
			return b.outboxRows(t) == 1 && counter.moveFailures.Load() >= 3
		})
		for i := range steady {
			b.write(t, "orders", message.NewMessage(fmt.Sprintf("steady-%02d", i), []byte{byte(i)}))
		}
		s.rec.waitDistinct(t, before+steady, 30*time.Second)
		poll(t, 30*time.Second, "the steady rows deleted", func() bool { return b.outboxRows(t) == 1 })
		elapsed := time.Since(start)

		deliveries, distinct, dups := s.rec.stats()
		require.Equal(t, before+steady, distinct)
		require.Zero(t, dups, "a good row was published again")
		require.False(t, s.rec.has("poison"))
		var left string
		require.NoError(t, b.db.QueryRow(`SELECT uuid FROM `+b.table).Scan(&left))
		require.Equal(t, "poison", left, "the row whose move failed stays in the outbox")
		require.Zero(t, counter.deadLettered.Load())

		var logged int
		for _, l := range logs.Captured()[watermill.ErrorLogLevel] {
			if strings.Contains(l.Msg, "could not move messages to the dead-letter table") {
				logged++
				require.ErrorContains(t, l.Err, "dead-letter table")
			}
		}
		require.GreaterOrEqual(t, logged, 1)
		require.LessOrEqual(t, logged, 1+int(elapsed/time.Minute), "logged once a minute, not once per batch")
		t.Logf("%s: dead-letter table dropped, %d good rows around a refused one, then %d more: %d deliveries (%d distinct, %d duplicates), 1 row left (the refused one), %d failed moves counted, logged %d time(s) in %s",
			b.name, before, steady, deliveries, distinct, dups, counter.moveFailures.Load(), logged, elapsed.Round(time.Millisecond))
	})
}
