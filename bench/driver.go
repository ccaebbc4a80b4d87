package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// result is one measured run.
type result struct {
	n       int           // deliveries
	elapsed time.Duration // wall time from the first publish to the last ack
	// latencies are the handler chain's times, one per delivery: from the
	// router calling the outermost middleware to its return.
	latencies []time.Duration
	// roundTrips is how many round trips the run's database connections
	// made (see roundTrips); 0 where not counted.
	roundTrips int64
}

func (r result) rate() float64 { return float64(r.n) / r.elapsed.Seconds() }

// recorder is the outermost middleware of a run: it times every delivery
// and keeps the first error. An error is acknowledged (the message is not
// redelivered: a benchmark must not loop on a broken handler) and fails
// the run afterwards.
type recorder struct {
	next      atomic.Int64
	latencies []time.Duration
	errOnce   sync.Once
	err       error
	done      atomic.Int64 // deliveries handled
}

func newRecorder(n int) *recorder { return &recorder{latencies: make([]time.Duration, n)} }

func (r *recorder) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		out, err := h(msg)
		took := time.Since(start)
		if i := r.next.Add(1) - 1; int(i) < len(r.latencies) {
			r.latencies[i] = took
		}
		if err != nil {
			r.errOnce.Do(func() { r.err = fmt.Errorf("message %s: %w", msg.UUID, err) })
		}
		r.done.Add(1)
		return out, nil
	}
}

// deliver sends msgs through a Watermill router over a GoChannel and
// returns when every one has been acknowledged.
//
// Concurrency: the messages are sharded over `concurrency` topics,
// msgs[i] to topic i mod concurrency, each consumed by a router handler of
// its own (all running the same handler chain), and each fed by one
// goroutine whose Publish blocks until the message is acknowledged
// (BlockPublishUntilSubscriberAck). So exactly `concurrency` deliveries
// are in flight, like `concurrency` consumers each holding one
// unacknowledged message. One topic would not do: GoChannel fans every
// message out to every subscriber of a topic (no consumer groups), and its
// Publish holds a per-topic lock until the ack, so one topic carries one
// delivery at a time whatever the number of publishers.
func deliver(ctx context.Context, h message.HandlerFunc, msgs []*message.Message, concurrency int) (result, error) {
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer pubsub.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, logger)
	if err != nil {
		return result{}, err
	}
	rec := newRecorder(len(msgs))
	chain := consume(rec.middleware(h))
	for g := range concurrency {
		router.AddConsumerHandler(shard(g), shard(g), pubsub, chain)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerErr := make(chan error, 1)
	go func() { routerErr <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-routerErr:
		return result{}, fmt.Errorf("router: %w", err)
	}

	var (
		wg      sync.WaitGroup
		pubErrs = make([]error, concurrency)
	)
	start := time.Now()
	for g := range concurrency {
		wg.Go(func() {
			for i := g; i < len(msgs); i += concurrency {
				if err := pubsub.Publish(shard(g), msgs[i]); err != nil {
					pubErrs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	closeErr := router.Close()
	runErr := <-routerErr
	if err := errors.Join(errors.Join(pubErrs...), closeErr, runErr, rec.err); err != nil {
		return result{}, err
	}
	if got := int(rec.done.Load()); got != len(msgs) {
		return result{}, fmt.Errorf("%d of %d messages handled", got, len(msgs))
	}
	return result{n: len(msgs), elapsed: elapsed, latencies: rec.latencies}, nil
}

// newMessages returns n messages with fresh UUIDs and a small JSON payload.
func newMessages(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		id := watermill.NewUUID()
		msgs[i] = message.NewMessage(id, fmt.Appendf(nil, `{"order":%q,"amount":%d}`, id, i+1))
	}
	return msgs
}

// copies returns new message values with the same UUIDs, payloads and
// metadata: redeliveries of msgs.
func copies(msgs []*message.Message) []*message.Message {
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		out[i] = m.Copy()
	}
	return out
}

// consume adapts h to a router handler without a publisher: the scenarios'
// handlers produce no messages.
func consume(h message.HandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		_, err := h(msg)
		return err
	}
}

// shard names the topic (and router handler) of feeder g.
func shard(g int) string { return fmt.Sprintf("bench-%d", g) }
