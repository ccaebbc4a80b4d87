package shop

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// errConfirmationLost is what a publish whose broker confirmation never
// arrived looks like to the producer.
var errConfirmationLost = errors.New("publish confirmation timed out")

// Producer publishes OrderPlaced events the way a careful service does:
// each order's message UUID is chosen once, and a publish that is not
// confirmed is retried with the same UUID. When the first copy did reach
// the broker, that retry is a duplicate on the wire, which the consumers'
// inboxes absorb.
type Producer struct {
	Publisher message.Publisher
	Topic     string
	// ConfirmationLost, when set, decides that the first publish of an
	// order reached the broker but its confirmation was lost (fault
	// injection), so the producer publishes it again.
	ConfirmationLost func(OrderPlaced) bool
	// Attempts is the most publishes per order. Default: 3.
	Attempts int
}

// Place publishes o and returns its message UUID and how many copies
// were published.
func (p *Producer) Place(o OrderPlaced) (uuid string, copies int, err error) {
	payload, err := json.Marshal(o)
	if err != nil {
		return "", 0, err
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	attempts := p.Attempts
	if attempts <= 0 {
		attempts = 3
	}
	for attempt := 1; ; attempt++ {
		// A copy per attempt: a publisher may keep the message it was given.
		err = p.Publisher.Publish(p.Topic, msg.Copy())
		if err == nil {
			copies++
			if attempt == 1 && p.ConfirmationLost != nil && p.ConfirmationLost(o) {
				err = errConfirmationLost
			}
		}
		if err == nil {
			return msg.UUID, copies, nil
		}
		if attempt == attempts {
			return msg.UUID, copies, fmt.Errorf("publishing order %s after %d attempts: %w", o.OrderID, attempts, err)
		}
	}
}
