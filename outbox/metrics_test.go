package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// dbResolution absorbs the databases' whole microseconds: an age the
// database computes has two ends, each rounded to a microsecond, and is
// compared below with windows on the test's own clock (the test databases
// run on this host, on the same clock). It is a resolution, not a timing
// allowance: every bound below is a window measured around the operation.
const dbResolution = 2 * time.Microsecond

// window is an interval on the test's clock measured around an operation:
// whatever the operation stamped happened inside it.
type window struct{ start, end time.Time }

// during runs op and returns the window around it.
func during(op func()) window {
	w := window{start: time.Now()}
	op()
	w.end = time.Now()
	return w
}

// publishTimes records, per topic, when the last Publish call to it
// returned.
type publishTimes struct {
	message.Publisher
	mu       sync.Mutex
	returned map[string]time.Time
}

func (p *publishTimes) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.returned[topic] = now
	return err
}

func (p *publishTimes) returnedAt(t *testing.T, topic string) time.Time {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.returned[topic]
	require.True(t, ok, "no Publish to %s", topic)
	return at
}

// backdate moves the created_at of topic's rows an hour into the past, as
// if they had waited that long.
func (b backend) backdate(t *testing.T, topic string) {
	t.Helper()
	q := `UPDATE ` + b.table + ` SET created_at = created_at - INTERVAL '1 hour' WHERE topic = $1`
	switch b.dialect {
	case sqldialect.MySQL:
		q = `UPDATE ` + b.table + ` SET created_at = created_at - INTERVAL 1 HOUR WHERE topic = ?`
	case sqldialect.SQLite: // Unix microseconds
		q = `UPDATE ` + b.table + ` SET created_at = created_at - 3600000000 WHERE topic = ?`
	}
	_, err := b.db.Exec(q, topic)
	require.NoError(t, err)
}

// Lag is reported per published message, in publish order, and is the
// time from the row's created_at until its Publish returned: at least the
// time from the end of the row's write to the moment the test saw that
// Publish return (plus the hour the old rows were backdated), at most the
// time from the start of the row's write to the end of ForwardBatch, plus
// the time from the relay's clock reading to the fetch statement's start at
// the database (the age is taken there, the rest on the relay's clock), a
// part of one round trip that the upper bound allows for with the batch's
// duration; it is never under.
func TestBatchLag(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		m := countingMetrics{forwarded: make(chan any, 10), failed: make(chan any, 10)}
		p := &publishTimes{Publisher: newSink(t, nil, "old", "new"), returned: map[string]time.Time{}}
		wrote := map[string]window{
			"old": during(func() { b.write(t, "old", newMessages("old", 2)...) }),
		}
		b.backdate(t, "old")
		wrote["new"] = during(func() { b.write(t, "new", newMessages("new", 3)...) })
		cfg := b.relayConfig()
		cfg.Observer = m
		relay, err := b.newRelay(p, cfg, nil)
		require.NoError(t, err)

		var n int
		forward := during(func() { n, err = relay.ForwardBatch(context.Background()) })
		require.NoError(t, err)
		require.Equal(t, 5, n)
		stats := (<-m.forwarded).(outbox.RelayBatch)
		require.Equal(t, 5, stats.Published)
		require.Len(t, stats.Lag, 5, "one lag per published message")
		for i, lag := range stats.Lag {
			topic, backdated := "new", time.Duration(0)
			if i < 2 { // the old rows have the lower ids: published first
				topic, backdated = "old", time.Hour
			}
			w := wrote[topic]
			least := backdated + p.returnedAt(t, topic).Sub(w.end) - dbResolution
			most := backdated + forward.end.Sub(w.start) + forward.end.Sub(forward.start) + dbResolution
			require.GreaterOrEqual(t, lag, least, "message %d (%s)", i, topic)
			require.LessOrEqual(t, lag, most, "message %d (%s)", i, topic)
		}
	})
}

// A batch whose publisher fails before publishing anything reports no lag:
// its messages will be published, and measured, again.
func TestBatchLagOnlyForPublished(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		m := countingMetrics{forwarded: make(chan any, 10), failed: make(chan any, 10)}
		s := newSink(t, nil, "a", "b")
		b.write(t, "a", newMessages("a", 2)...)
		b.write(t, "b", newMessages("b", 3)...)
		cfg := b.relayConfig()
		cfg.Observer = m
		relay, err := b.newRelay(&failOnce{Publisher: s, topic: "b"}, cfg, nil)
		require.NoError(t, err)
		_, err = relay.ForwardBatch(context.Background())
		require.Error(t, err)
		stats := (<-m.forwarded).(outbox.RelayBatch)
		require.Equal(t, [2]int{5, 2}, [2]int{stats.Claimed, stats.Published})
		require.Len(t, stats.Lag, 2)
	})
}

// Backlog counts the rows and reports the oldest one's age: at least the
// time from the end of its write to the start of the Backlog call (plus the
// hour the old rows were backdated), at most the time from the start of its
// write to the end of the call.
func TestBacklog(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := newSink(t, nil, "old", "new")
		cfg := b.relayConfig()
		cfg.BatchSize = 5
		relay, err := b.newRelay(s, cfg, nil)
		require.NoError(t, err)

		backlog, err := relay.Backlog(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.Backlog{}, backlog, "empty outbox")

		sample := func() window {
			return during(func() { backlog, err = relay.Backlog(ctx) })
		}
		requireAge := func(wrote, sampled window, backdated time.Duration, msg string) {
			t.Helper()
			require.GreaterOrEqual(t, backlog.OldestAge, backdated+sampled.start.Sub(wrote.end)-dbResolution, msg)
			require.LessOrEqual(t, backlog.OldestAge, backdated+sampled.end.Sub(wrote.start)+dbResolution, msg)
		}

		old := during(func() { b.write(t, "old", newMessages("old", 4)...) })
		b.backdate(t, "old")
		fresh := during(func() { b.write(t, "new", newMessages("new", 3)...) })
		sampled := sample()
		require.NoError(t, err)
		require.Equal(t, 7, backlog.Messages)
		requireAge(old, sampled, time.Hour, "the backdated rows are the oldest")

		n, err := relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, n)
		sampled = sample()
		require.NoError(t, err)
		require.Equal(t, 2, backlog.Messages)
		requireAge(fresh, sampled, 0, "the backdated rows are gone")

		n, err = relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		backlog, err = relay.Backlog(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.Backlog{}, backlog)
	})
}

func TestBacklogIntervalValidated(t *testing.T) {
	err := outbox.RelayConfig{Dialect: sqldialect.MySQL, BacklogInterval: -time.Second}.Validate()
	require.ErrorContains(t, err, "RelayConfig.BacklogInterval must be positive")
}

// backlogMetrics records every backlog sample and wakes waiters.
type backlogMetrics struct {
	mu      sync.Mutex
	samples []outbox.Backlog
	changed chan struct{}
}

func (m *backlogMetrics) forwardedBatch(outbox.RelayBatch) {}
func (m *backlogMetrics) failedBatch(error)                {}

func (m *backlogMetrics) ObserveBacklog(_ context.Context, b outbox.Backlog) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.samples = append(m.samples, b)
	close(m.changed)
	m.changed = make(chan struct{})
}

// waitSample waits for the first sample after the first `after` ones that
// satisfies ok and returns its index.
func (m *backlogMetrics) waitSample(t *testing.T, after int, ok func(outbox.Backlog) bool) int {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		m.mu.Lock()
		samples, ch := m.samples, m.changed
		m.mu.Unlock()
		for i := after; i < len(samples); i++ {
			if ok(samples[i]) {
				return i
			}
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no matching backlog sample after %d in %v", after, samples)
		}
	}
}

// gate blocks every Publish until opened and signals the first call.
type gate struct {
	message.Publisher
	entered, open       chan struct{}
	enterOnce, openOnce sync.Once
}

func (g *gate) Publish(topic string, msgs ...*message.Message) error {
	g.enterOnce.Do(func() { close(g.entered) })
	<-g.open
	return g.Publisher.Publish(topic, msgs...)
}

func (g *gate) release() { g.openOnce.Do(func() { close(g.open) }) }

// Run samples the backlog for an Observer that implements BacklogObserver:
// the exact count while a batch holds the rows unacknowledged, 0 after.
func TestRunSamplesBacklog(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		m := &backlogMetrics{changed: make(chan struct{})}
		g := &gate{Publisher: newSink(t, nil, "a"), entered: make(chan struct{}), open: make(chan struct{})}
		b.write(t, "a", newMessages("a", 6)...)
		cfg := b.relayConfig()
		cfg.Observer = m
		cfg.BacklogInterval = 5 * time.Millisecond
		relay, err := b.newRelay(g, cfg, testLogger(t))
		require.NoError(t, err)
		runRelay(t, relay)
		t.Cleanup(g.release) // runs before runRelay's Close

		m.waitSample(t, 0, func(outbox.Backlog) bool { return true })
		<-g.entered
		m.mu.Lock()
		claimedAt := len(m.samples)
		m.mu.Unlock()
		// Rows claimed by the batch in flight are still backlog.
		i := m.waitSample(t, claimedAt, func(outbox.Backlog) bool { return true })
		m.mu.Lock()
		held := append([]outbox.Backlog(nil), m.samples[:i+1]...)
		m.mu.Unlock()
		for _, s := range held {
			require.Equal(t, 6, s.Messages)
		}

		g.release()
		i = m.waitSample(t, i+1, func(s outbox.Backlog) bool { return s.Messages == 0 })
		m.mu.Lock()
		require.Equal(t, outbox.Backlog{Relay: cfg.Table}, m.samples[i], "named after the table by default")
		m.mu.Unlock()
	})
}

// ObserveRelayBatch makes backlogMetrics a RelayObserver.
func (m *backlogMetrics) ObserveRelayBatch(_ context.Context, b outbox.RelayBatch) {
	splitBatch(b, m.forwardedBatch, m.failedBatch)
}
