package servicebus_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/examples/internal/ledger"
	"github.com/idemkit/watermill-idempotent/examples/servicebus"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// fakeQueue stands for a Service Bus queue in PeekLock mode: an abandoned
// message goes back to the queue with DeliveryCount + 1 and, past
// maxDeliveryCount, to the dead-letter list; a completed one is gone.
type fakeQueue struct {
	maxDeliveryCount uint32

	mu                            sync.Mutex
	ready                         []*azservicebus.ReceivedMessage
	wake                          chan struct{}
	completed, abandoned, letters []string // MessageIds
	renewals                      int
	closed                        bool
}

func newFakeQueue(msgs ...*azservicebus.ReceivedMessage) *fakeQueue {
	q := &fakeQueue{maxDeliveryCount: 10, wake: make(chan struct{}, 1)}
	for _, m := range msgs {
		q.send(m)
	}
	return q
}

func (q *fakeQueue) send(m *azservicebus.ReceivedMessage) {
	q.mu.Lock()
	defer q.mu.Unlock()
	m.DeliveryCount++
	q.ready = append(q.ready, m)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *fakeQueue) ReceiveMessages(ctx context.Context, maxMessages int, _ *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	for {
		q.mu.Lock()
		if n := min(maxMessages, len(q.ready)); n > 0 {
			got := q.ready[:n:n]
			q.ready = q.ready[n:]
			q.mu.Unlock()
			return got, nil
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-q.wake:
		}
	}
}

func (q *fakeQueue) CompleteMessage(_ context.Context, m *azservicebus.ReceivedMessage, _ *azservicebus.CompleteMessageOptions) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.completed = append(q.completed, m.MessageID)
	return nil
}

func (q *fakeQueue) AbandonMessage(_ context.Context, m *azservicebus.ReceivedMessage, _ *azservicebus.AbandonMessageOptions) error {
	q.mu.Lock()
	q.abandoned = append(q.abandoned, m.MessageID)
	dead := m.DeliveryCount >= q.maxDeliveryCount
	if dead {
		q.letters = append(q.letters, m.MessageID)
	}
	q.mu.Unlock()
	if !dead {
		q.send(m)
	}
	return nil
}

func (q *fakeQueue) RenewMessageLock(context.Context, *azservicebus.ReceivedMessage, *azservicebus.RenewMessageLockOptions) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.renewals++
	return nil
}

func (q *fakeQueue) Close(context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	return nil
}

// state returns a copy of what the queue recorded.
func (q *fakeQueue) state() (completed, abandoned, letters []string, renewals int, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]string(nil), q.completed...), append([]string(nil), q.abandoned...),
		append([]string(nil), q.letters...), q.renewals, q.closed
}

func sbMessage(id, body string, props map[string]any) *azservicebus.ReceivedMessage {
	return &azservicebus.ReceivedMessage{MessageID: id, Body: []byte(body), ApplicationProperties: props}
}

func subscriber(t *testing.T, q *fakeQueue, renew time.Duration) *servicebus.Subscriber {
	t.Helper()
	sub, err := servicebus.NewSubscriber(servicebus.SubscriberConfig{
		NewReceiver: func(topic string) (servicebus.Receiver, error) {
			require.Equal(t, "orders", topic)
			return q, nil
		},
		RenewLockEvery: renew,
	}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sub.Close()) })
	return sub
}

func next(t *testing.T, msgs <-chan *message.Message) *message.Message {
	t.Helper()
	select {
	case m, ok := <-msgs:
		require.True(t, ok, "channel closed")
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message within 10 s")
		return nil
	}
}

// eventually polls cond until it holds or 10 s have passed.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond)
}

func TestMessage(t *testing.T) {
	seq, corr := int64(42), "corr-1"
	enqueued := time.Date(2025, 5, 6, 7, 8, 9, 0, time.UTC)
	m := sbMessage("order-1", `{"id":1}`, map[string]any{"tenant": "acme", "priority": int64(3), "at": enqueued})
	m.CorrelationID, m.SequenceNumber, m.EnqueuedTime, m.DeliveryCount = &corr, &seq, &enqueued, 2

	msg := servicebus.Message(m)
	require.Equal(t, "order-1", msg.UUID, "the MessageId is the UUID, the inbox's default key")
	require.Equal(t, `{"id":1}`, string(msg.Payload))
	require.Equal(t, message.Metadata{
		"tenant":                             "acme",
		"priority":                           "3",
		"at":                                 "2025-05-06T07:08:09Z",
		wmiddleware.CorrelationIDMetadataKey: "corr-1",
		servicebus.MetadataMessageID:         "order-1",
		servicebus.MetadataDeliveryCount:     "2",
		servicebus.MetadataSequenceNumber:    "42",
		servicebus.MetadataEnqueuedTime:      "2025-05-06T07:08:09Z",
	}, msg.Metadata)
}

func TestAckCompletesNackAbandons(t *testing.T) {
	q := newFakeQueue(sbMessage("a", "1", nil), sbMessage("b", "2", nil))
	msgs, err := subscriber(t, q, -1).Subscribe(t.Context(), "orders")
	require.NoError(t, err)

	a := next(t, msgs)
	require.Equal(t, "a", a.UUID)
	a.Ack()
	b := next(t, msgs)
	require.Equal(t, "b", b.UUID)
	require.Equal(t, "1", b.Metadata.Get(servicebus.MetadataDeliveryCount))
	b.Nack()
	again := next(t, msgs)
	require.Equal(t, "b", again.UUID, "an abandoned message is delivered again")
	require.Equal(t, "2", again.Metadata.Get(servicebus.MetadataDeliveryCount))
	again.Ack()

	eventually(t, func() bool { c, _, _, _, _ := q.state(); return len(c) == 2 })
	completed, abandoned, _, _, _ := q.state()
	require.Equal(t, []string{"a", "b"}, completed)
	require.Equal(t, []string{"b"}, abandoned)
}

func TestLockRenewedWhileHandlerRuns(t *testing.T) {
	q := newFakeQueue(sbMessage("slow", "1", nil))
	msgs, err := subscriber(t, q, time.Millisecond).Subscribe(t.Context(), "orders")
	require.NoError(t, err)
	msg := next(t, msgs)
	eventually(t, func() bool { _, _, _, r, _ := q.state(); return r >= 3 })
	msg.Ack()
	eventually(t, func() bool { c, _, _, _, _ := q.state(); return len(c) == 1 })
	require.Error(t, msg.Context().Err(), "the message's context, and with it the renewal, ends once it is settled")
}

func TestCloseAbandonsTheUnsettledMessage(t *testing.T) {
	q := newFakeQueue(sbMessage("pending", "1", nil))
	sub := subscriber(t, q, -1)
	msgs, err := sub.Subscribe(t.Context(), "orders")
	require.NoError(t, err)
	next(t, msgs) // never settled
	require.NoError(t, sub.Close())
	_, ok := <-msgs
	require.False(t, ok, "Close closes the channel")
	_, abandoned, _, _, closed := q.state()
	require.Equal(t, []string{"pending"}, abandoned, "so Service Bus delivers it again without waiting for the lock")
	require.True(t, closed)
	_, err = sub.Subscribe(t.Context(), "orders")
	require.ErrorIs(t, err, servicebus.ErrClosed)
}

// TestRouterWithInbox runs a Watermill router over the Subscriber with
// the inbox on PostgreSQL. The queue holds a, b, and a again (same
// MessageId: sent after the duplicate-detection window, or by a sender
// that lost its answer); b's handler fails on its first delivery; c
// reuses a's MessageId with another body and goes to the poison topic.
// Every message is completed, a and b are applied once each, b's first
// delivery is abandoned, and nothing is dead-lettered.
func TestRouterWithInbox(t *testing.T) {
	db, _ := testenv.PostgresSchema(t, "exservicebus_")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	repo, err := ledger.Migrate(ctx, db)
	require.NoError(t, err)
	q := newFakeQueue(sbMessage("a", "apple", nil), sbMessage("b", "banana", nil), sbMessage("a", "apple", nil),
		sbMessage("a", "cherry", nil))
	sub := subscriber(t, q, -1)

	outcomes := &ledger.Outcomes{}
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Observer: outcomes})
	require.NoError(t, err)
	poisoned := &ledger.Topic{}
	poison, err := wmiddleware.PoisonQueueWithFilter(poisoned, "orders_poison", idempotency.IsPermanent)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(poison, inbox.Middleware)
	var failedOnce sync.Once
	router.AddConsumerHandler("billing", "orders", sub, func(msg *message.Message) error {
		var err error
		if msg.UUID == "b" {
			failedOnce.Do(func() { err = errors.New("database hiccup") })
		}
		if err != nil {
			return err
		}
		return ledger.Record(msg)
	})
	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	wg.Go(func() { _ = router.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()

	eventually(t, func() bool { c, _, _, _, _ := q.state(); return len(c) == 4 })
	completed, abandoned, letters, _, _ := q.state()
	require.ElementsMatch(t, []string{"a", "b", "a", "a"}, completed)
	require.Equal(t, []string{"b"}, abandoned)
	require.Empty(t, letters)
	rows, distinct, err := ledger.Count(ctx, db)
	require.NoError(t, err)
	require.Equal(t, [2]int{2, 2}, [2]int{rows, distinct})
	require.Equal(t, 1, outcomes.Count(idempotency.OutcomePayloadMismatch))
	eventually(t, func() bool { return len(poisoned.Messages()) == 1 })
	require.Equal(t, "cherry", string(poisoned.Messages()[0].Payload))
}

// TestMaxDeliveryCountDeadLetters shows the other way out: a message
// whose handler always fails transiently is abandoned until Service Bus's
// MaxDeliveryCount moves it to the dead-letter queue (3 here).
func TestMaxDeliveryCountDeadLetters(t *testing.T) {
	q := newFakeQueue(sbMessage("x", "1", nil))
	q.maxDeliveryCount = 3
	msgs, err := subscriber(t, q, -1).Subscribe(t.Context(), "orders")
	require.NoError(t, err)
	for range 3 {
		next(t, msgs).Nack()
	}
	eventually(t, func() bool { _, _, l, _, _ := q.state(); return len(l) == 1 })
	_, abandoned, letters, _, _ := q.state()
	require.Equal(t, []string{"x", "x", "x"}, abandoned)
	require.Equal(t, []string{"x"}, letters)
}
