package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsAckWait is how long JetStream waits for an ack before it redelivers
// a message to another subscriber of the durable consumer. It is the only
// thing that redelivers a message whose subscriber died: keep it above
// the longest handler run (a slower handler is redelivered while it runs,
// a duplicate the inbox absorbs) and short enough that a crash is
// recovered quickly.
const natsAckWait = 3 * time.Second

// newNATSPublisher returns watermill-nats v2's JetStream publisher: a
// message on topic goes to the subject of the same name, stored by the
// stream of the same name (CreateTopics makes it). It sets no Nats-Msg-Id,
// so JetStream's duplicate window does not drop a re-send: the scenario
// wants the re-sends to reach the inbox (see docs/examples.md).
func newNATSPublisher(config Config, logger watermill.LoggerAdapter) (*wmjs.Publisher, error) {
	return wmjs.NewPublisher(wmjs.PublisherConfig{URL: config.NATSURL, Logger: logger})
}

// newNATSSubscriber returns a subscriber of the durable pull consumer
// named group on the topic's stream: the group's subscribers pull from
// one consumer, so they compete for its messages. Each pulls one message
// at a time (a pulled message's ack wait is already running), acks it
// explicitly, and NAKs it on a handler error (JetStream redelivers at
// once).
func newNATSSubscriber(config Config, group string, logger watermill.LoggerAdapter) (*wmjs.Subscriber, error) {
	return wmjs.NewSubscriber(wmjs.SubscriberConfig{
		URL:                 config.NATSURL,
		Logger:              logger,
		AckWaitTimeout:      natsAckWait,
		ResourceInitializer: natsDurableConsumer(group),
		ConsumeOptions:      []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(1)},
	})
}

// natsDurableConsumer creates (or finds) the durable consumer group on the
// topic's stream. It returns no closer: the consumer, with its
// acknowledgement state, outlives every subscriber, which is what lets a
// crashed subscriber's message go to another one.
func natsDurableConsumer(group string) wmjs.ResourceInitializer {
	return func(ctx context.Context, js jetstream.JetStream, topic string) (jetstream.Consumer, func(context.Context, watermill.LoggerAdapter), error) {
		c, err := js.CreateOrUpdateConsumer(ctx, topic, jetstream.ConsumerConfig{
			Durable:       group,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       natsAckWait,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("nats: consumer %s on stream %s: %w", group, topic, err)
		}
		return c, nil, nil
	}
}

func natsJetStream(config Config) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(config.NATSURL)
	if err != nil {
		return nil, nil, fmt.Errorf("nats at %s: %w", config.NATSURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("nats: %w", err)
	}
	return nc, js, nil
}

// createNATSStreams makes a stream per topic, capturing the subject of the
// same name (limits retention: every consumer sees every message).
func createNATSStreams(ctx context.Context, config Config, topics []string) error {
	nc, js, err := natsJetStream(config)
	if err != nil {
		return err
	}
	defer nc.Close()
	for _, t := range topics {
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: t, Subjects: []string{t}}); err != nil {
			return fmt.Errorf("nats: creating stream %s: %w", t, err)
		}
	}
	return nil
}

// deleteNATSStreams deletes the streams named after topics, with their
// consumers. A stream that does not exist is not an error.
func deleteNATSStreams(ctx context.Context, config Config, topics []string) error {
	nc, js, err := natsJetStream(config)
	if err != nil {
		return err
	}
	defer nc.Close()
	var errs []error
	for _, t := range topics {
		if err := js.DeleteStream(ctx, t); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("nats cleanup: deleting stream %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}
