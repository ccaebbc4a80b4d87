// Package servicebus is the smallest Watermill subscriber over Azure
// Service Bus (the official SDK, azservicebus), so that a Watermill router
// — and the inbox — can consume a queue or a topic subscription. Watermill
// has no Service Bus Pub/Sub of its own.
//
//	client, err := azservicebus.NewClientFromConnectionString(conn, nil)
//	if err != nil {
//		return err
//	}
//	sub, err := servicebus.NewSubscriber(servicebus.SubscriberConfig{
//		NewReceiver: servicebus.ReceiverFor(client), // "orders" or "orders/billing"
//	}, logger)
//	if err != nil {
//		return err
//	}
//	router.AddConsumerHandler("billing", "orders", sub, bill)
//
// A received message becomes a Watermill message whose UUID is the Service
// Bus MessageId — the inbox's default key — with the application
// properties in its metadata. Messages are received in PeekLock mode: an
// Ack completes the message, a Nack abandons it (Service Bus delivers it
// again, DeliveryCount + 1, and moves it to the dead-letter queue past the
// entity's MaxDeliveryCount), and the lock is renewed while the handler
// runs.
//
// The mapping is unit-tested on a fake receiver; it is untested against
// a real Service Bus namespace. See docs/brokers.md.
package servicebus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// Receiver is the part of *azservicebus.Receiver the Subscriber uses.
type Receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	RenewMessageLock(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
	Close(ctx context.Context) error
}

// Metadata keys the Subscriber sets besides the application properties.
// The correlation id goes to Watermill's own key
// (wmiddleware.CorrelationIDMetadataKey).
const (
	MetadataMessageID      = "servicebus_message_id"
	MetadataDeliveryCount  = "servicebus_delivery_count"
	MetadataSequenceNumber = "servicebus_sequence_number"
	MetadataEnqueuedTime   = "servicebus_enqueued_time"
)

// DefaultRenewLockEvery is SubscriberConfig.RenewLockEvery's default: a
// third of the one-minute lock Service Bus gives a queue or subscription
// by default.
const DefaultRenewLockEvery = 20 * time.Second

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// NewReceiver opens a PeekLock receiver (the SDK's default mode) for
	// the topic given to Subscribe. ReceiverFor(client) reads "queue" as
	// a queue and "topic/subscription" as a topic subscription. Required.
	NewReceiver func(topic string) (Receiver, error)
	// RenewLockEvery is how often the lock of a message in the handler is
	// renewed. Keep it well under the entity's LockDuration. Default:
	// DefaultRenewLockEvery; negative: never.
	RenewLockEvery time.Duration
	// SettleTimeout bounds each complete, abandon and renewal call.
	// Default: 30 s.
	SettleTimeout time.Duration
	// ReceiveRetryWait is the pause after a failed ReceiveMessages.
	// Default: 1 s.
	ReceiveRetryWait time.Duration
}

func (c *SubscriberConfig) setDefaults() {
	if c.RenewLockEvery == 0 {
		c.RenewLockEvery = DefaultRenewLockEvery
	}
	if c.SettleTimeout == 0 {
		c.SettleTimeout = 30 * time.Second
	}
	if c.ReceiveRetryWait == 0 {
		c.ReceiveRetryWait = time.Second
	}
}

// Validate reports what is missing from the configuration.
func (c SubscriberConfig) Validate() error {
	if c.NewReceiver == nil {
		return errors.New("servicebus: SubscriberConfig.NewReceiver is required")
	}
	return nil
}

// ReceiverFor returns a SubscriberConfig.NewReceiver opening PeekLock
// receivers on client: "queue" for a queue, "topic/subscription" for a
// topic's subscription.
func ReceiverFor(client *azservicebus.Client) func(topic string) (Receiver, error) {
	return func(topic string) (Receiver, error) {
		if t, sub, ok := strings.Cut(topic, "/"); ok {
			return client.NewReceiverForSubscription(t, sub, nil)
		}
		return client.NewReceiverForQueue(topic, nil)
	}
}

// ErrClosed is returned by Subscribe after Close.
var ErrClosed = errors.New("servicebus: subscriber closed")

// Subscriber is a message.Subscriber over Service Bus receivers. Each
// Subscribe opens a receiver and hands its messages out one at a time:
// the next is received only once the previous one is settled.
type Subscriber struct {
	config SubscriberConfig
	logger watermill.LoggerAdapter

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// NewSubscriber validates config and returns a Subscriber. A nil logger
// logs nothing.
func NewSubscriber(config SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{config: config, logger: logger, ctx: ctx, cancel: cancel}, nil
}

// Subscribe opens a receiver for topic and returns its messages. The
// channel closes when ctx ends or the Subscriber is closed; a message not
// yet settled then is abandoned, so it is delivered again at once rather
// than when its lock expires.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	r, err := s.config.NewReceiver(topic)
	if err != nil {
		return nil, fmt.Errorf("servicebus: open receiver for %q: %w", topic, err)
	}
	out := make(chan *message.Message)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.ctx, cancel)
	s.wg.Go(func() {
		defer func() {
			stop()
			cancel()
			s.settle(func(ctx context.Context) error { return r.Close(ctx) }, "close receiver", watermill.LogFields{"topic": topic})
			close(out)
		}()
		s.receive(ctx, r, topic, out)
	})
	return out, nil
}

// receive hands r's messages to out until ctx ends.
func (s *Subscriber) receive(ctx context.Context, r Receiver, topic string, out chan<- *message.Message) {
	for ctx.Err() == nil {
		received, err := r.ReceiveMessages(ctx, 1, nil)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.logger.Error("servicebus: receive failed", err, watermill.LogFields{"topic": topic})
			select {
			case <-ctx.Done():
				return
			case <-time.After(s.config.ReceiveRetryWait):
			}
			continue
		}
		for i, m := range received {
			if !s.deliver(ctx, r, m, out) {
				for _, rest := range received[i+1:] {
					s.abandon(r, rest)
				}
				return
			}
		}
	}
}

// deliver hands m to out, renews its lock until the handler settles it
// and completes (Ack) or abandons (Nack) it. It returns false when ctx
// ended first; m is abandoned then.
func (s *Subscriber) deliver(ctx context.Context, r Receiver, m *azservicebus.ReceivedMessage, out chan<- *message.Message) bool {
	msg := Message(m)
	msgCtx, done := context.WithCancel(ctx)
	defer done()
	msg.SetContext(msgCtx)
	select {
	case out <- msg:
	case <-ctx.Done():
		s.abandon(r, m)
		return false
	}
	if every := s.config.RenewLockEvery; every > 0 {
		s.wg.Go(func() { s.renewLock(msgCtx, r, m, every) })
	}
	fields := watermill.LogFields{"message_uuid": msg.UUID}
	select {
	case <-msg.Acked():
		s.settle(func(ctx context.Context) error { return r.CompleteMessage(ctx, m, nil) }, "complete", fields)
		return true
	case <-msg.Nacked():
		s.abandon(r, m)
		return true
	case <-ctx.Done():
		s.abandon(r, m)
		return false
	}
}

// renewLock renews m's lock every every until ctx ends.
func (s *Subscriber) renewLock(ctx context.Context, r Receiver, m *azservicebus.ReceivedMessage, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, s.config.SettleTimeout)
			err := r.RenewMessageLock(rctx, m, nil)
			cancel()
			if err != nil && ctx.Err() == nil {
				s.logger.Error("servicebus: lock renewal failed; the message may be delivered again", err,
					watermill.LogFields{"message_uuid": m.MessageID})
			}
		}
	}
}

func (s *Subscriber) abandon(r Receiver, m *azservicebus.ReceivedMessage) {
	s.settle(func(ctx context.Context) error { return r.AbandonMessage(ctx, m, nil) }, "abandon",
		watermill.LogFields{"message_uuid": m.MessageID})
}

// settle runs op under SettleTimeout, even when the subscription is
// ending, and logs its failure: a message whose complete failed (its lock
// was lost) is delivered again, and the inbox acknowledges the copy.
func (s *Subscriber) settle(op func(context.Context) error, what string, fields watermill.LogFields) {
	ctx, cancel := context.WithTimeout(context.Background(), s.config.SettleTimeout)
	defer cancel()
	if err := op(ctx); err != nil {
		s.logger.Error("servicebus: "+what+" failed", err, fields)
	}
}

// Close ends every subscription, abandons the messages not yet settled,
// closes the receivers and waits for them.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// Message converts a received Service Bus message: the UUID is the
// MessageId, the payload the body; the metadata holds the application
// properties (strings as they are, other values formatted with fmt), the
// correlation id under Watermill's key and the MessageId, DeliveryCount,
// SequenceNumber and EnqueuedTime under the Metadata… keys.
func Message(m *azservicebus.ReceivedMessage) *message.Message {
	msg := message.NewMessage(m.MessageID, m.Body)
	for k, v := range m.ApplicationProperties {
		switch v := v.(type) {
		case string:
			msg.Metadata.Set(k, v)
		case time.Time:
			msg.Metadata.Set(k, v.UTC().Format(time.RFC3339Nano))
		default:
			msg.Metadata.Set(k, fmt.Sprint(v))
		}
	}
	if m.CorrelationID != nil {
		msg.Metadata.Set(wmiddleware.CorrelationIDMetadataKey, *m.CorrelationID)
	}
	msg.Metadata.Set(MetadataMessageID, m.MessageID)
	msg.Metadata.Set(MetadataDeliveryCount, strconv.FormatUint(uint64(m.DeliveryCount), 10))
	if m.SequenceNumber != nil {
		msg.Metadata.Set(MetadataSequenceNumber, strconv.FormatInt(*m.SequenceNumber, 10))
	}
	if m.EnqueuedTime != nil {
		msg.Metadata.Set(MetadataEnqueuedTime, m.EnqueuedTime.UTC().Format(time.RFC3339Nano))
	}
	return msg
}
