package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// realTime reports whether OUTBOX_REAL_TIME asks these tests to run with
// the relay's default intervals and a real 60 s outage instead of the
// same schedule scaled down 50 times.
func realTime() bool { return os.Getenv("OUTBOX_REAL_TIME") != "" }

// callLog refuses every Publish call holding a message whose UUID starts
// with "poison", with err, and records the UUIDs of every call.
type callLog struct {
	message.Publisher
	err   error
	mu    sync.Mutex
	calls [][]string
}

func (p *callLog) Publish(topic string, msgs ...*message.Message) error {
	uuids := make([]string, len(msgs))
	poison := false
	for i, m := range msgs {
		uuids[i] = m.UUID
		poison = poison || strings.HasPrefix(m.UUID, "poison")
	}
	p.mu.Lock()
	p.calls = append(p.calls, uuids)
	p.mu.Unlock()
	if poison {
		return p.err
	}
	return p.Publisher.Publish(topic, msgs...)
}

// singles counts, per UUID, the calls that held it alone.
func (p *callLog) singles() (calls int, alone map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	alone = map[string]int{}
	for _, c := range p.calls {
		if len(c) == 1 {
			alone[c[0]]++
		}
	}
	return len(p.calls), alone
}

// failedBatches records when each failed batch ended.
type failedBatches struct {
	mu  sync.Mutex
	end []time.Time
}

func (f *failedBatches) forwardedBatch(outbox.RelayBatch) {}
func (f *failedBatches) failedBatch(error) {
	f.mu.Lock()
	f.end = append(f.end, time.Now())
	f.mu.Unlock()
}

func (f *failedBatches) times() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.end...)
}

// backingOffRelay returns a relay of b's outbox into pub with
// MaxAttempts 1, the given retry intervals, and its failed batches.
func backingOffRelay(t *testing.T, b backend, pub message.Publisher, retry, maxRetry time.Duration) (*outbox.Relay, *failedBatches) {
	failed := &failedBatches{}
	cfg := b.relayConfig()
	cfg.MaxAttempts = 1
	cfg.RetryInterval, cfg.MaxRetryInterval = retry, maxRetry
	cfg.Observer = failed
	relay, err := b.newRelay(pub, cfg, testLogger(t))
	require.NoError(t, err)
	return relay, failed
}

func writePoison(t *testing.T, b backend, n int) {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("poison-%02d", i), []byte{byte(i)})
	}
	b.write(t, "t", msgs...)
}

// Issue 23: two or more poison rows alone in a quiet outbox looped for
// ever (2 rows, MaxAttempts 3: 238 refused publishes in 5 s, none
// dead-lettered), because a batch in which two rows were refused and
// none accepted was taken for an outage. A refusal the publisher marks
// permanent is the row's: each row is charged once per batch, refused
// alone exactly MaxAttempts times, and dead-lettered.
func TestQuietPoisonRowsAreDeadLettered(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		for _, n := range []int{1, 2, 10} {
			t.Run(fmt.Sprint(n), func(t *testing.T) {
				ctx := context.Background()
				const maxAttempts = 3
				pub := &callLog{Publisher: newSink(t, nil, "t"), err: outbox.Permanent(errors.New("message too large"))}
				writePoison(t, b, n)
				cfg := b.relayConfig()
				if realTime() {
					cfg.RetryInterval = 0 // the default, 1 s
				}
				cfg.MaxAttempts = maxAttempts
				relay, err := b.newRelay(pub, cfg, testLogger(t))
				require.NoError(t, err)
				start := time.Now()
				runRelay(t, relay)
				dl := b.deadLetters(t)
				poll(t, 60*time.Second, fmt.Sprintf("%d dead letters", n), func() bool {
					c, err := dl.Count(ctx)
					require.NoError(t, err)
					return c == n
				})
				took := time.Since(start)
				require.Zero(t, b.outboxRows(t))
				letters, err := dl.List(ctx, outbox.ListParams{})
				require.NoError(t, err)
				calls, alone := pub.singles()
				want := maxAttempts
				if n == 1 {
					want++ // the first batch's call of the whole run held it alone, uncharged
				}
				for _, l := range letters {
					require.Equal(t, maxAttempts, l.Attempts, l.UUID)
					require.Equal(t, want, alone[l.UUID], "%s refused alone once per charge", l.UUID)
					require.Contains(t, l.LastError, "message too large")
				}
				_, err = dl.Delete(ctx, ids(letters)...)
				require.NoError(t, err)
				t.Logf("%s: %d poison rows alone, permanent refusals, MaxAttempts %d: %d dead-lettered after %s, %d Publish calls",
					b.name, n, maxAttempts, len(letters), took.Round(time.Millisecond), calls)
			})
		}
	})
}

func ids(letters []outbox.DeadLetter) []int64 {
	out := make([]int64, len(letters))
	for i, l := range letters {
		out[i] = l.ID
	}
	return out
}

// Rows refused with an error not known to be permanent, alone in a
// quiet outbox: the relay presumes the publisher down, charges nothing
// and backs off, the pause doubling up to MaxRetryInterval; once there,
// each batch is one Publish call per MaxRetryInterval. OUTBOX_REAL_TIME
// runs it with the default intervals (1 s, 30 s) for 7 batches, 61 s.
func TestQuietUnknownRefusalsBackOff(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		retry, maxRetry, batches := 5*time.Millisecond, 80*time.Millisecond, 10
		if realTime() {
			retry, maxRetry, batches = time.Second, 30*time.Second, 7 // the defaults; 61 s
		}
		pub := &callLog{Publisher: newSink(t, nil, "t"), err: errors.New("broker said no")}
		writePoison(t, b, 2)
		relay, failed := backingOffRelay(t, b, pub, retry, maxRetry)
		runRelay(t, relay)
		poll(t, 30*time.Second+3*maxRetry, fmt.Sprintf("%d failed batches", batches), func() bool { return len(failed.times()) >= batches })
		require.NoError(t, relay.Close())

		ends := failed.times()
		calls, _ := pub.singles()
		pause := retry
		for k := 1; k < len(ends); k++ {
			gap := ends[k].Sub(ends[k-1])
			require.GreaterOrEqual(t, gap, pause, "pause before batch %d", k+1)
			pause = min(2*pause, maxRetry)
		}
		// Batch 1 is one call (the run), batch 2 isolates (the pair, the
		// first row, the probe of the second), every later one is the
		// probe alone.
		require.Equal(t, len(ends)+2, calls)
		count, err := b.deadLetters(t).Count(ctx)
		require.NoError(t, err)
		require.Zero(t, count, "an unknown refusal with nothing accepted is charged nothing")
		var attempts int
		require.NoError(t, b.db.QueryRow(`SELECT MAX(attempts) FROM `+b.table).Scan(&attempts))
		require.Zero(t, attempts)
		window := ends[len(ends)-1].Sub(ends[len(ends)-4])
		t.Logf("%s: 2 rows refused with an unknown error, RetryInterval %s, MaxRetryInterval %s: %d batches, %d Publish calls in %s; the last 3 batches took %s (3 calls), none charged",
			b.name, retry, maxRetry, len(ends), calls, ends[len(ends)-1].Sub(ends[0]).Round(time.Millisecond), window.Round(time.Millisecond))
	})
}

// A publisher down for 60 s (scaled down 50 times unless
// OUTBOX_REAL_TIME is set) dead-letters nothing and costs a bounded
// number of Publish calls; everything is published once it is back.
func TestPublisherOutageDeadLettersNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		const rows = 5
		retry, maxRetry, outage := 20*time.Millisecond, 600*time.Millisecond, 1200*time.Millisecond
		if realTime() {
			retry, maxRetry, outage = time.Second, 30*time.Second, 60*time.Second
		}
		s := newSink(t, nil, "t")
		pub := &failAll{Publisher: s}
		pub.down.Store(true)
		b.write(t, "t", newMessages("m", rows)...)
		relay, failed := backingOffRelay(t, b, pub, retry, maxRetry)
		start := time.Now()
		up := time.AfterFunc(outage, func() { pub.down.Store(false) })
		defer up.Stop()
		runRelay(t, relay)
		s.rec.waitDistinct(t, rows, outage+maxRetry+30*time.Second)
		recovered := time.Since(start)

		count, err := b.deadLetters(t).Count(ctx)
		require.NoError(t, err)
		require.Zero(t, count)
		_, distinct, dups := s.rec.stats()
		require.Equal(t, rows, distinct)
		require.Zero(t, dups)
		// The most batches the schedule fits in the outage: one at 0,
		// then one after each pause.
		batches, elapsed, pause := 1, time.Duration(0), retry
		for elapsed+pause < outage {
			elapsed += pause
			batches++
			pause = min(2*pause, maxRetry)
		}
		calls := pub.calls.Load()
		// Batch 1: the run (1 call); batch 2 isolates (5, 2, 1, probe);
		// every later batch is the probe alone.
		require.LessOrEqual(t, calls, int64(batches+3))
		require.LessOrEqual(t, len(failed.times()), batches)
		t.Logf("%s: publisher down %s, %d rows, MaxAttempts 1, RetryInterval %s, MaxRetryInterval %s: %d failed batches, %d Publish calls refused, 0 dead-lettered, all %d published %s after the start",
			b.name, outage, rows, retry, maxRetry, len(failed.times()), calls, rows, recovered.Round(time.Millisecond))
	})
}

// ObserveRelayBatch makes failedBatches a RelayObserver.
func (f *failedBatches) ObserveRelayBatch(_ context.Context, b outbox.RelayBatch) {
	splitBatch(b, f.forwardedBatch, f.failedBatch)
}
