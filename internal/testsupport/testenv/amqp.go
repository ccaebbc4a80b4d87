package testenv

import (
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// AMQP environment variable and its default.
const (
	AMQPEnv     = "AMQP_URL"
	AMQPDefault = "amqp://guest:guest@127.0.0.1:5672/"
)

// AMQPURL returns the RabbitMQ URL tests use.
func AMQPURL() string { return getenv(AMQPEnv, AMQPDefault) }

// AMQP checks that RabbitMQ answers at AMQPURL (a full AMQP handshake,
// not only a TCP connect) and returns the URL. When it does not, t is
// skipped with a message naming the service, or fails under CI=true.
// Tests share the server: give queues and exchanges names no other test
// uses, and delete them when t ends.
func AMQP(t testing.TB) string {
	t.Helper()
	url := AMQPURL()
	conn, err := amqp091.DialConfig(url, amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)})
	if err != nil {
		MissingAt(t, "RabbitMQ", AMQPEnv, url, err)
	}
	_ = conn.Close()
	return url
}
