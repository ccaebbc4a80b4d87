package middleware_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
)

const (
	ordersTopic   = "orders"
	paymentsTopic = "payments"
	poisonTopic   = "poison"
	waitFor       = 30 * time.Second
)

// flow is a running router on a GoChannel with a collector of what its
// handlers publish downstream.
type flow struct {
	pubSub *gochannel.GoChannel
	router *message.Router

	mu         sync.Mutex
	delivered  map[string]int // successful handler completions by message UUID
	completed  atomic.Int64
	downstream map[string][]*message.Message // by topic
}

func newFlow(t *testing.T) *flow {
	logger := watermill.NopLogger{}
	f := &flow{
		pubSub:     gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024, Persistent: true}, logger),
		delivered:  map[string]int{},
		downstream: map[string][]*message.Message{},
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	f.router = r
	t.Cleanup(func() { require.NoError(t, f.pubSub.Close()) })
	return f
}

// count is the outermost middleware: it counts deliveries that the router
// acknowledges.
func (f *flow) count(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			f.mu.Lock()
			f.delivered[msg.UUID]++
			f.mu.Unlock()
			f.completed.Add(1)
		}
		return out, err
	}
}

// collect subscribes to topic and keeps what arrives.
func (f *flow) collect(t *testing.T, topic string) {
	msgs, err := f.pubSub.Subscribe(t.Context(), topic)
	require.NoError(t, err)
	go func() {
		for m := range msgs {
			f.mu.Lock()
			f.downstream[topic] = append(f.downstream[topic], m)
			f.mu.Unlock()
			m.Ack()
		}
	}()
}

func (f *flow) downstreamOf(topic string) []*message.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*message.Message(nil), f.downstream[topic]...)
}

func (f *flow) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.router.Run(ctx) }()
	<-f.router.Running()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func (f *flow) publish(t *testing.T, msgs ...*message.Message) {
	for _, m := range msgs {
		require.NoError(t, f.pubSub.Publish(ordersTopic, m))
	}
}

// waitCompleted waits until n deliveries were acknowledged.
func (f *flow) waitCompleted(t *testing.T, n int) {
	require.Eventually(t, func() bool { return f.completed.Load() >= int64(n) }, waitFor, 5*time.Millisecond,
		"waiting for %d acknowledged deliveries", n)
}

func (f *flow) waitDownstream(t *testing.T, topic string, n int) {
	require.Eventually(t, func() bool { return len(f.downstreamOf(topic)) >= n }, waitFor, 5*time.Millisecond,
		"waiting for %d messages on %s", n, topic)
}

func TestRouterDuplicatesFromThePublisher(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		f := newFlow(t)
		h := &chargeHandler{s: s}
		f.router.AddMiddleware(f.count, s.newInbox(t, "billing").Middleware)
		f.router.AddHandler("billing", ordersTopic, f.pubSub, paymentsTopic, f.pubSub, h.Handle)
		f.collect(t, paymentsTopic)
		f.run(t)

		const orders = 40
		published := 0
		for i := range orders {
			// Orders are sent once, twice or three times with the same UUID:
			// a producer retrying after a lost publish confirmation.
			for range 1 + i%3 {
				f.publish(t, orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 10 + i}))
				published++
			}
		}
		f.waitCompleted(t, published)
		f.waitDownstream(t, paymentsTopic, published)

		require.EqualValues(t, orders, h.runs.Load(), "the handler runs once per order")
		require.Equal(t, orders, s.totalCharges(t))
		for i := range orders {
			require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("o-%d", i)), "order %d", i)
		}
		// Every delivery, first or duplicate, publishes the one stored
		// payment event: one UUID per order, repeated on replays.
		uuids := map[string]int{}
		for _, m := range f.downstreamOf(paymentsTopic) {
			uuids[m.UUID]++
		}
		require.Len(t, uuids, orders)
		require.Len(t, f.downstreamOf(paymentsTopic), published)
	})
}

// failFirstAttempt fails the first handler run of every third order after
// the charge was written, like a handler whose last step times out.
func failFirstAttempt(s *store) *chargeHandler {
	var mu sync.Mutex
	failed := map[string]bool{}
	return &chargeHandler{s: s, before: func(msg *message.Message, _ *sql.Tx) error {
		var n int
		if _, err := fmt.Sscanf(msg.UUID, "uuid-%d", &n); err != nil || n%3 != 0 {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if failed[msg.UUID] {
			return nil
		}
		failed[msg.UUID] = true
		return errors.New("transient failure")
	}}
}

func TestRouterRedeliveryAfterHandlerErrorRunsAgain(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		f := newFlow(t)
		h := failFirstAttempt(s)
		f.router.AddMiddleware(f.count, s.newInbox(t, "billing").Middleware)
		f.router.AddConsumerHandler("billing", ordersTopic, f.pubSub, func(msg *message.Message) error {
			_, err := h.Handle(msg)
			return err
		})
		f.run(t)

		const orders = 30 // uuid-0, uuid-3, … uuid-27 fail once: 10 failures
		for i := range orders {
			f.publish(t, orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 5}))
		}
		f.waitCompleted(t, orders)

		require.EqualValues(t, orders+10, h.runs.Load(), "each failed order ran again on redelivery")
		for i := range orders {
			require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("o-%d", i)), "order %d charged exactly once", i)
		}
	})
}

// TestWatermillDeduplicatorDropsRedeliveryAfterHandlerError runs the same
// scenario with Watermill's own Deduplicator to show what the test above
// guards against: it records the key before the handler runs, so the
// redelivery of a failed message is dropped as a duplicate and the order
// is never charged.
func TestWatermillDeduplicatorDropsRedeliveryAfterHandlerError(t *testing.T) {
	s := newSQLiteStore(t)
	f := newFlow(t)
	h := failFirstAttempt(s)
	dedup := &wmiddleware.Deduplicator{KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil }}
	f.router.AddMiddleware(f.count, dedup.Middleware)
	f.router.AddConsumerHandler("billing", ordersTopic, f.pubSub, func(msg *message.Message) error {
		_, err := h.Handle(msg)
		return err
	})
	f.run(t)

	const orders = 30
	for i := range orders {
		f.publish(t, orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 5}))
	}
	f.waitCompleted(t, orders)

	require.EqualValues(t, orders, h.runs.Load(), "the redeliveries never reached the handler")
	require.Equal(t, orders-10, s.totalCharges(t), "the 10 orders whose first attempt failed are lost")
	require.Zero(t, s.chargesFor(t, "o-0"))
}

func TestRouterCrashAfterCommitBeforeAckReplaysOutput(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		f := newFlow(t)
		h := &chargeHandler{s: s}
		var mu sync.Mutex
		crashed := map[string]bool{}
		firstOutput := map[string]string{} // order UUID → payment UUID of the first run
		// crash sits outside the inbox: after the inbox committed, the
		// process "dies" before the router publishes the output and acks,
		// so the broker redelivers.
		crash := func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := next(msg)
				mu.Lock()
				defer mu.Unlock()
				if err == nil && !crashed[msg.UUID] {
					crashed[msg.UUID] = true
					firstOutput[msg.UUID] = out[0].UUID
					return nil, errors.New("crash before ack")
				}
				return out, err
			}
		}
		f.router.AddMiddleware(f.count, crash, s.newInbox(t, "billing").Middleware)
		f.router.AddHandler("billing", ordersTopic, f.pubSub, paymentsTopic, f.pubSub, h.Handle)
		f.collect(t, paymentsTopic)
		f.run(t)

		const orders = 10
		for i := range orders {
			f.publish(t, orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 7}))
		}
		f.waitCompleted(t, orders)
		f.waitDownstream(t, paymentsTopic, orders)

		require.EqualValues(t, orders, h.runs.Load(), "the redelivery after the crash did not run the handler")
		require.Equal(t, orders, s.totalCharges(t))
		got := map[string]bool{}
		for _, m := range f.downstreamOf(paymentsTopic) {
			got[m.UUID] = true
		}
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, got, orders)
		for order, paymentUUID := range firstOutput {
			require.True(t, got[paymentUUID], "payment of %s is published with the UUID of the committed run", order)
		}
	})
}

func TestRouterConcurrentCopiesAcrossHandlers(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		f := newFlow(t)
		h := &chargeHandler{s: s}
		const handlers = 4
		// Four handlers of one consumer subscribe to the topic; GoChannel
		// hands each of them a copy of every message at the same time,
		// like competing consumers holding redelivered copies. Each
		// handler has its own scope by default; HandlerScopes puts the
		// four in one on purpose.
		shared := map[string]string{}
		for i := range handlers {
			shared[fmt.Sprintf("billing-%d", i)] = "billing"
		}
		for i := range handlers {
			hd := f.router.AddConsumerHandler(fmt.Sprintf("billing-%d", i), ordersTopic, f.pubSub, func(msg *message.Message) error {
				_, err := h.Handle(msg)
				return err
			})
			hd.AddMiddleware(f.count, s.newInbox(t, "shop", func(c *middleware.Config) { c.HandlerScopes = shared }).Middleware)
		}
		f.run(t)

		const orders = 25
		for i := range orders {
			f.publish(t, orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 3}))
		}
		f.waitCompleted(t, orders*handlers)

		require.EqualValues(t, orders, h.runs.Load())
		require.Equal(t, orders, s.totalCharges(t))
		for i := range orders {
			require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("o-%d", i)), "order %d", i)
		}
	})
}

func TestRouterPoisonQueueForPermanentErrors(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		f := newFlow(t)
		h := &chargeHandler{s: s}
		poison, err := wmiddleware.PoisonQueueWithFilter(f.pubSub, poisonTopic, idempotency.IsPermanent)
		require.NoError(t, err)
		f.router.AddMiddleware(f.count, poison, s.newInbox(t, "billing", func(c *middleware.Config) {
			c.Key = middleware.MetadataKey("idempotency_key")
		}).Middleware)
		f.router.AddConsumerHandler("billing", ordersTopic, f.pubSub, func(msg *message.Message) error {
			_, err := h.Handle(msg)
			return err
		})
		f.collect(t, poisonTopic)
		f.run(t)

		keyed := func(uuid, key string, o order) *message.Message {
			m := orderMessage(uuid, o)
			if key != "" {
				m.Metadata.Set("idempotency_key", key)
			}
			return m
		}
		// GoChannel does not keep order: let the first use of k-1 land first.
		f.publish(t, keyed("m-1", "k-1", order{ID: "o-1", Amount: 10}))
		f.waitCompleted(t, 1)
		f.publish(t,
			keyed("m-2", "", order{ID: "o-2", Amount: 10}),    // no key
			keyed("m-3", "k-1", order{ID: "o-1", Amount: 99}), // key reused for other content
			keyed("m-4", "k-1", order{ID: "o-1", Amount: 10}), // a true duplicate
			keyed("m-5", "k-5", order{ID: "o-5", Amount: 10}),
		)
		f.waitCompleted(t, 5)
		f.waitDownstream(t, poisonTopic, 2)

		poisoned := map[string]string{}
		for _, m := range f.downstreamOf(poisonTopic) {
			poisoned[m.UUID] = m.Metadata.Get(wmiddleware.ReasonForPoisonedKey)
		}
		require.Len(t, poisoned, 2)
		require.Contains(t, poisoned["m-2"], idempotency.ErrNoKey.Error())
		require.Contains(t, poisoned["m-3"], idempotency.ErrPayloadMismatch.Error())
		require.EqualValues(t, 2, h.runs.Load())
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
		require.Equal(t, 1, s.chargesFor(t, "o-5"))
		require.Zero(t, s.chargesFor(t, "o-2"))
	})
}
