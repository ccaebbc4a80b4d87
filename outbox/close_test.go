package outbox_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// blockingPublisher blocks every Publish until released, signalling
// the first call.
type blockingPublisher struct {
	message.Publisher
	entered, release   chan struct{}
	enterOnce, relOnce sync.Once
}

func newBlockingPublisher(p message.Publisher) *blockingPublisher {
	return &blockingPublisher{Publisher: p, entered: make(chan struct{}), release: make(chan struct{})}
}

func (p *blockingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.enterOnce.Do(func() { close(p.entered) })
	<-p.release
	return p.Publisher.Publish(topic, msgs...)
}

func (p *blockingPublisher) open() { p.relOnce.Do(func() { close(p.release) }) }

// A publisher whose Publish blocks cannot hold Close: it returns
// ErrCloseTimeout after CloseTimeout, the batch is abandoned (its row
// stays in the outbox), and Run returns once the blocked call does.
func TestCloseIsBoundedWhenPublishBlocks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		const closeTimeout = 300 * time.Millisecond
		s := newSink(t, nil, "t")
		pub := newBlockingPublisher(s)
		t.Cleanup(pub.open)
		b.write(t, "t", message.NewMessage("m", nil))
		cfg := b.relayConfig()
		cfg.CloseTimeout = closeTimeout
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- relay.Run(context.Background()) }()
		<-pub.entered

		// The Publish stays blocked until pub.open below: Close must
		// return without it, after CloseTimeout. The deadline only ends a
		// Close that waits for the Publish; it is not a timing bound.
		start := time.Now()
		closed := make(chan error, 1)
		go func() { closed <- relay.Close() }()
		select {
		case err = <-closed:
		case <-time.After(closeTimeout + 30*time.Second):
			pub.open()
			t.Fatal("Close waited for the blocked Publish")
		}
		took := time.Since(start)
		require.ErrorIs(t, err, outbox.ErrCloseTimeout)
		require.ErrorContains(t, err, "abandoned")
		require.GreaterOrEqual(t, took, closeTimeout)

		pub.open()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after the blocked Publish returned")
		}
		require.Equal(t, 1, b.outboxRows(t), "the abandoned batch is published again later")
		require.ErrorIs(t, relay.Run(context.Background()), outbox.ErrRelayClosed)
		t.Logf("%s: Publish blocked; Close returned after %s (CloseTimeout %s): %v", b.name, took.Round(time.Millisecond), closeTimeout, err)
	})
}

// closeMidBatch holds the first Publish call until Close has been
// called, so the batch is in flight while Close waits.
type closeMidBatch struct {
	message.Publisher
	relay   *outbox.Relay
	entered chan struct{}
	once    sync.Once
}

func (p *closeMidBatch) Publish(topic string, msgs ...*message.Message) error {
	p.once.Do(func() {
		close(p.entered)
		<-p.relay.StopRequested()
	})
	return p.Publisher.Publish(topic, msgs...)
}

// A graceful Close in the middle of a batch lets it finish: every
// message is published once and acknowledged, the outbox is empty.
// (Before, Close cancelled the batch after publishing and before its
// delete: all 100 received, 100 rows still in the table.)
func TestGracefulCloseFinishesBatchInFlight(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		const total, topics = 100, 5
		names := make([]string, topics)
		for i := range names {
			names[i] = "t" + strconv.Itoa(i)
		}
		s := newSink(t, nil, names...)
		for i := range topics {
			// Five runs of 20: the batch is five Publish calls.
			b.write(t, names[i], newMessages(names[i], total/topics)...)
		}
		pub := &closeMidBatch{Publisher: s, entered: make(chan struct{})}
		relay, err := b.newRelay(pub, b.relayConfig(), testLogger(t))
		require.NoError(t, err)
		pub.relay = relay
		done := make(chan error, 1)
		go func() { done <- relay.Run(context.Background()) }()
		<-pub.entered
		require.NoError(t, relay.Close())
		require.NoError(t, <-done)

		deliveries, distinct, dups := s.rec.stats()
		left := b.outboxRows(t)
		t.Logf("%s: Close during the first of 5 Publish calls of a 100-row batch: %d delivered, %d distinct, %d duplicates, %d rows left", b.name, deliveries, distinct, dups, left)
		require.Equal(t, total, distinct)
		require.Zero(t, dups)
		require.Zero(t, left)
	})
}

// discard counts what it is given and keeps nothing.
type discard struct{ messages, bytes atomic.Int64 }

func (d *discard) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		d.messages.Add(1)
		d.bytes.Add(int64(len(m.Payload)))
	}
	return nil
}
func (d *discard) Close() error { return nil }

// heapPeak samples the heap every millisecond until stop is called and
// returns the largest samples of its objects (live and not yet
// collected) and of its live part as of the last GC.
func heapPeak() (stop func() (objects, live uint64)) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
	var objects, live uint64
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			objects = max(objects, sample[0].Value.Uint64())
			live = max(live, sample[1].Value.Uint64())
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	return func() (uint64, uint64) {
		close(quit)
		<-done
		return objects, live
	}
}

// The relay's memory is bounded by MaxBatchBytes, not BatchSize: 60 rows
// of 10 MiB drain with a peak heap of a few rows, where a batch of
// BatchSize rows held all 60 at once (846 MiB measured before).
// OUTBOX_HEAP_MAX_BATCH_BYTES overrides MaxBatchBytes to compare.
func TestBatchBytesBoundHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 600 MiB per database")
	}
	const rows, size = 60, 10 << 20
	maxBatchBytes := outbox.DefaultMaxBatchBytes
	if v := getenvInt(t, "OUTBOX_HEAP_MAX_BATCH_BYTES"); v > 0 {
		maxBatchBytes = v
	}
	// Not parallel: the heap is the process's.
	forEachBackendSequential(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		payload := make([]byte, size)
		for i := range rows {
			payload[0] = byte(i)
			b.write(t, "big", message.NewMessage(fmt.Sprintf("big-%02d", i), payload))
		}
		payload = nil
		pub := &discard{}
		cfg := b.relayConfig()
		cfg.MaxBatchBytes = maxBatchBytes
		relay, err := b.newRelay(pub, cfg, testLogger(t))
		require.NoError(t, err)

		runtime.GC()
		stop := heapPeak()
		start := time.Now()
		batches := 0
		for pub.messages.Load() < rows {
			_, err := relay.ForwardBatch(ctx)
			require.NoError(t, err)
			batches++
		}
		took := time.Since(start)
		objects, live := stop()
		require.EqualValues(t, rows, pub.messages.Load())
		require.EqualValues(t, rows*size, pub.bytes.Load())
		require.Zero(t, b.outboxRows(t))
		t.Logf("%s: %d rows of %d MiB, MaxBatchBytes %d MiB: %d batches in %s; peak heap %d MiB (%.1f rows' worth), peak live heap after GC %d MiB (%.1f rows' worth)",
			b.name, rows, size>>20, maxBatchBytes>>20, batches, took.Round(time.Millisecond), objects>>20, float64(objects)/size, live>>20, float64(live)/size)
		if maxBatchBytes == outbox.DefaultMaxBatchBytes {
			// A row is held about three times while it is read (driver
			// buffer, decoded value, database/sql's copy); the rest is
			// garbage the GC has not collected yet.
			require.Less(t, live, uint64(8*size), "live heap within 8 rows' worth")
			require.Less(t, objects, uint64(16*size), "heap within 16 rows' worth")
		}
	})
}
