package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// clockSlack absorbs the rounding of database timestamps to microseconds
// when a database-measured age is compared with the test's own clock (the
// test databases run on this host, on the same clock).
const clockSlack = 5 * time.Millisecond

// backdate moves the created_at of topic's rows an hour into the past, as
// if they had waited that long.
func (b backend) backdate(t *testing.T, topic string) {
	t.Helper()
	q := `UPDATE ` + b.table + ` SET created_at = created_at - INTERVAL '1 hour' WHERE topic = $1`
	switch b.dialect {
	case outbox.MySQL:
		q = `UPDATE ` + b.table + ` SET created_at = created_at - INTERVAL 1 HOUR WHERE topic = ?`
	case outbox.SQLite: // Unix microseconds
		q = `UPDATE ` + b.table + ` SET created_at = created_at - 3600000000 WHERE topic = ?`
	}
	_, err := b.db.Exec(q, topic)
	require.NoError(t, err)
}

// Lag is reported per published message, in publish order, from the
// row's created_at: an hour for rows that waited an hour, at most the
// test's duration for fresh ones.
func TestBatchLag(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		m := countingMetrics{forwarded: make(chan any, 10), failed: make(chan any, 10)}
		s := newSink(t, nil, "old", "new")
		start := time.Now()
		b.write(t, "old", newMessages("old", 2)...)
		b.backdate(t, "old")
		b.write(t, "new", newMessages("new", 3)...)
		cfg := b.relayConfig()
		cfg.Metrics = m
		relay, err := b.newRelay(s, cfg, nil)
		require.NoError(t, err)

		n, err := relay.ForwardBatch(context.Background())
		require.NoError(t, err)
		elapsed := time.Since(start)
		require.Equal(t, 5, n)
		stats := (<-m.forwarded).(outbox.BatchStats)
		require.Equal(t, 5, stats.Published)
		require.Len(t, stats.Lag, 5, "one lag per published message")
		for i, lag := range stats.Lag {
			base := time.Duration(0)
			if i < 2 {
				base = time.Hour
			}
			require.GreaterOrEqual(t, lag, base, "message %d", i)
			require.LessOrEqual(t, lag, base+elapsed+clockSlack, "message %d", i)
		}
		require.LessOrEqual(t, stats.Lag[2], stats.Lag[0]-time.Hour+clockSlack, "a row written later has not waited longer")
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
		cfg.Metrics = m
		relay, err := b.newRelay(&failOnce{Publisher: s, topic: "b"}, cfg, nil)
		require.NoError(t, err)
		_, err = relay.ForwardBatch(context.Background())
		require.Error(t, err)
		stats := (<-m.forwarded).(outbox.BatchStats)
		require.Equal(t, [2]int{5, 2}, [2]int{stats.Claimed, stats.Published})
		require.Len(t, stats.Lag, 2)
	})
}

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

		start := time.Now()
		b.write(t, "old", newMessages("old", 4)...)
		b.backdate(t, "old")
		b.write(t, "new", newMessages("new", 3)...)
		backlog, err = relay.Backlog(ctx)
		require.NoError(t, err)
		require.Equal(t, 7, backlog.Messages)
		require.GreaterOrEqual(t, backlog.OldestAge, time.Hour)
		require.LessOrEqual(t, backlog.OldestAge, time.Hour+time.Since(start)+clockSlack)

		n, err := relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, n)
		backlog, err = relay.Backlog(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, backlog.Messages)
		require.Less(t, backlog.OldestAge, time.Since(start)+clockSlack, "the backdated rows are gone")

		n, err = relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		backlog, err = relay.Backlog(ctx)
		require.NoError(t, err)
		require.Equal(t, outbox.Backlog{}, backlog)
	})
}

func TestBacklogIntervalValidated(t *testing.T) {
	err := outbox.RelayConfig{Dialect: outbox.MySQL, BacklogInterval: -time.Second}.Validate()
	require.ErrorContains(t, err, "RelayConfig.BacklogInterval must be positive")
}

// backlogMetrics records every backlog sample and wakes waiters.
type backlogMetrics struct {
	mu      sync.Mutex
	samples []outbox.Backlog
	changed chan struct{}
}

func (m *backlogMetrics) BatchForwarded(outbox.BatchStats) {}
func (m *backlogMetrics) BatchFailed(error)                {}

func (m *backlogMetrics) ObserveBacklog(b outbox.Backlog) {
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

// Run samples the backlog for a Metrics that implements BacklogObserver:
// the exact count while a batch holds the rows unacknowledged, 0 after.
func TestRunSamplesBacklog(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		m := &backlogMetrics{changed: make(chan struct{})}
		g := &gate{Publisher: newSink(t, nil, "a"), entered: make(chan struct{}), open: make(chan struct{})}
		b.write(t, "a", newMessages("a", 6)...)
		cfg := b.relayConfig()
		cfg.Metrics = m
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
		require.Equal(t, outbox.Backlog{}, m.samples[i])
		m.mu.Unlock()
	})
}
