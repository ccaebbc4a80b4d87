package broker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// amqpConfig is watermill-amqp's durable pub/sub topology: a durable
// fanout exchange per topic, a durable queue per topic and group,
// persistent messages, one unacknowledged delivery per consumer at a time
// (prefetch 1), and publisher confirms so a publish returns once RabbitMQ
// has the message.
func amqpConfig(url string, queueName amqp.QueueNameGenerator) amqp.Config {
	c := amqp.NewDurablePubSubConfig(url, queueName)
	c.Publish.ConfirmDelivery = true
	return c
}

func newAMQPPublisher(config Config, logger watermill.LoggerAdapter) (*amqp.Publisher, error) {
	return amqp.NewPublisher(amqpConfig(config.AMQPURL, nil), logger)
}

func (b *Broker) newAMQPSubscriber(group string) (*amqpSubscriber, error) {
	config := amqpConfig(b.config.AMQPURL, func(topic string) string {
		name := topic + "_" + group
		b.mu.Lock()
		b.queues[name] = struct{}{}
		b.mu.Unlock()
		return name
	})
	tracker := &channelTracker{Marshaler: config.Marshaler}
	config.Marshaler = tracker
	sub, err := amqp.NewSubscriber(config, b.logger)
	if err != nil {
		return nil, err
	}
	return &amqpSubscriber{Subscriber: sub, channels: tracker}, nil
}

// amqpSubscriber is watermill-amqp's subscriber plus what Crash needs.
type amqpSubscriber struct {
	*amqp.Subscriber
	channels *channelTracker
}

// channelTracker remembers the AMQP channel of the latest delivery, so
// Crash can close the channel that holds it. With prefetch 1 that
// channel holds exactly one unacknowledged delivery.
type channelTracker struct {
	amqp.Marshaler
	latest atomic.Pointer[amqp091.Channel]
}

func (t *channelTracker) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if ch, ok := d.Acknowledger.(*amqp091.Channel); ok {
		t.latest.Store(ch)
	}
	return t.Marshaler.Unmarshal(d)
}

// deleteAMQP deletes queues and the exchanges named after topics. A name
// that does not exist is not an error.
func deleteAMQP(ctx context.Context, config Config, exchanges, queues []string) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	conn, err := amqp091.DialConfig(config.AMQPURL, amqp091.Config{Dial: amqp091.DefaultDial(time.Until(deadline))})
	if err != nil {
		return fmt.Errorf("amqp cleanup: %w", err)
	}
	defer conn.Close()
	// A failed delete closes its channel, so each gets a fresh one.
	do := func(what, name string, op func(*amqp091.Channel) error) error {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("amqp cleanup: %w", err)
		}
		err = op(ch)
		var amqpErr *amqp091.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp091.NotFound {
			return nil
		}
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("amqp cleanup: deleting %s %s: %w", what, name, err)
		}
		return nil
	}
	var errs []error
	for _, q := range queues {
		errs = append(errs, do("queue", q, func(ch *amqp091.Channel) error {
			_, err := ch.QueueDelete(q, false, false, false)
			return err
		}))
	}
	for _, e := range exchanges {
		errs = append(errs, do("exchange", e, func(ch *amqp091.Channel) error {
			return ch.ExchangeDelete(e, false, false)
		}))
	}
	return errors.Join(errs...)
}
