package amqpkeys_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/watermill-idempotent/keysource/amqpkeys"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// A Watermill consumer of a queue fed by a Java, Python or plain
// amqp091-go producer: with amqpkeys.Marshaler the inbox keys each message
// by its message_id property through the default middleware.UUIDKey.
func ExampleMarshaler() {
	config := amqp.NewDurableQueueConfig("amqp://guest:guest@127.0.0.1:5672/")
	config.Marshaler = amqpkeys.Marshaler{}
	// sub, err := amqp.NewSubscriber(config, logger); the router and the
	// inbox stay as they are.

	// What the subscriber makes of a delivery from such a producer:
	msg, err := config.Marshaler.Unmarshal(amqp091.Delivery{
		MessageId:     "order-17",
		CorrelationId: "checkout-9",
		AppId:         "java-shop",
		Headers:       amqp091.Table{"attempt": int32(2)},
		Body:          []byte(`{"id":"17","cents":1299}`),
	})
	if err != nil {
		panic(err)
	}
	key, err := middleware.UUIDKey(msg)
	if err != nil {
		panic(err)
	}
	fmt.Println("key:", key)
	fmt.Println("correlation_id:", msg.Metadata.Get(amqpkeys.CorrelationID))
	fmt.Println("app_id:", msg.Metadata.Get(amqpkeys.AppID))
	fmt.Println("attempt:", msg.Metadata.Get("attempt"))
	// Output:
	// key: order-17
	// correlation_id: checkout-9
	// app_id: java-shop
	// attempt: 2
}
