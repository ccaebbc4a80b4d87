package kafkakeys_test

import (
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/idemkit/watermill-idempotent/keysource/kafkakeys"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// A Watermill consumer of a topic fed by producers that are not
// Watermill: with kafkakeys.Unmarshaler the inbox keys each record by the
// producer's "message_id" header, or a CloudEvent by its source and id,
// through the default middleware.UUIDKey.
func ExampleUnmarshaler() {
	config := kafka.SubscriberConfig{
		Brokers:       []string{"127.0.0.1:9092"},
		Unmarshaler:   kafkakeys.Unmarshaler{KeyHeader: "message_id"},
		ConsumerGroup: "billing",
	}
	// sub, err := kafka.NewSubscriber(config, logger); the router and the
	// inbox stay as they are.

	// What the subscriber makes of records from such producers:
	for _, headers := range [][]*sarama.RecordHeader{
		{{Key: []byte("message_id"), Value: []byte("order-17")}},
		{ // a binary-mode CloudEvent
			{Key: []byte("ce_specversion"), Value: []byte("1.0")},
			{Key: []byte("ce_id"), Value: []byte("evt-1")},
			{Key: []byte("ce_source"), Value: []byte("/shop/eu")},
			{Key: []byte("ce_type"), Value: []byte("shop.order.placed")},
		},
	} {
		msg, err := config.Unmarshaler.Unmarshal(&sarama.ConsumerMessage{
			Key: []byte("17"), Value: []byte(`{"id":"17"}`), Headers: headers,
		})
		if err != nil {
			panic(err)
		}
		key, err := middleware.UUIDKey(msg)
		if err != nil {
			panic(err)
		}
		fmt.Println("key:", key)
	}
	// Output:
	// key: order-17
	// key: 8:/shop/eu:evt-1
}
