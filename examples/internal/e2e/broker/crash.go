package broker

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmjs "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Crash is fault injection for the examples and their tests: a service
// never calls it. It makes the broker see what it sees when the process
// owning sub dies while holding an unacknowledged delivery, so the
// redelivery that follows is the broker's own:
//
//   - amqp: the AMQP channel holding the delivery is closed without
//     acking. RabbitMQ requeues the delivery and redelivers it, flagged
//     redelivered, to a competing consumer or to this one once it has
//     opened a new channel (watermill-amqp does that on its own, like a
//     restarted process). The subscriber survives. (Closing the whole
//     connection would do the same for RabbitMQ, but watermill-amqp
//     v2.1.3's connection-level reconnect has a data race the race
//     detector reports; the channel-level recovery has none.)
//   - kafka: the consumer-group member leaves without committing the
//     delivery's offset. The group rebalances and the partition's next
//     owner consumes it again from the last committed offset. The
//     subscriber is gone: its router stops, and a replacement instance has
//     to join the group.
//   - nats: the subscriber closes (its pull subscription and connection
//     go) without acking. JetStream redelivers the message to another
//     subscriber of the durable consumer when the ack wait runs out. The
//     subscriber is gone, as on Kafka.
//   - redis: the subscriber closes without XACK. The message stays in the
//     group's pending entries list under the dead consumer's name until
//     another consumer claims it (XCLAIM, once idle for the max idle
//     time). The subscriber is gone.
//   - sql: the subscriber closes; its transaction, which holds the group's
//     offset row, commits without moving the offset, and the next
//     subscriber of the group reads the message again. The subscriber is
//     gone.
//   - gochannel: there is no connection to lose; the caller's nack makes
//     GoChannel resend. The subscriber survives.
//
// Call it from the handler that holds the delivery, then return an error.
func Crash(sub message.Subscriber) (survives bool, err error) {
	switch s := sub.(type) {
	case *amqpSubscriber:
		ch := s.channels.latest.Load()
		if ch == nil {
			return true, errors.New("amqp crash: no delivery received yet")
		}
		if err := ch.Close(); err != nil {
			return true, fmt.Errorf("amqp crash: closing the channel: %w", err)
		}
		return true, nil
	case *kafka.Subscriber:
		// Close returns once the member has left the group; the held
		// message was never marked, so its offset is not committed.
		if err := s.Close(); err != nil {
			return false, fmt.Errorf("kafka crash: %w", err)
		}
		return false, nil
	case *wmjs.Subscriber, *redisstream.Subscriber, *wmsql.Subscriber:
		if err := sub.Close(); err != nil {
			return false, fmt.Errorf("crash: closing the subscriber: %w", err)
		}
		return false, nil
	case *goChannelSubscriber:
		return true, nil
	}
	return true, fmt.Errorf("crash: unsupported subscriber %T", sub)
}
