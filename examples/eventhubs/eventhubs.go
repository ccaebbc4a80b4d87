// Package eventhubs connects watermill-kafka (Sarama) to Azure Event Hubs
// through the namespace's Kafka endpoint, so the inbox runs behind an
// ordinary watermill-kafka subscriber:
//
//	conn := os.Getenv("EVENTHUBS_CONNECTION_STRING") // Endpoint=sb://NAMESPACE.servicebus.windows.net/;SharedAccessKeyName=…;SharedAccessKey=…
//	brokers, err := eventhubs.Brokers(conn)           // NAMESPACE.servicebus.windows.net:9093
//	if err != nil {
//		return err
//	}
//	sc := eventhubs.SaramaConfig(kafka.DefaultSaramaSubscriberConfig(), conn)
//	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
//		Brokers: brokers, Unmarshaler: kafka.DefaultMarshaler{},
//		OverwriteSaramaConfig: sc, ConsumerGroup: "billing",
//	}, logger)
//
// The event hub is the Kafka topic; its consumer groups are Kafka consumer
// groups, and the offsets they commit are Event Hubs' checkpoints. A
// consumer that restarts resumes at the last committed offset, so every
// event after it is delivered again: that, and a rewound or deleted
// consumer group, are the duplicates the inbox absorbs. The tests run this
// configuration against kfake with SASL PLAIN and TLS off; against a real
// namespace it is untested here. See docs/brokers.md.
package eventhubs

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/IBM/sarama"
)

// ConnectionStringUser is the SASL PLAIN user name Event Hubs expects when
// the password is a shared access connection string.
const ConnectionStringUser = "$ConnectionString"

// KafkaPort is the port of a namespace's Kafka endpoint.
const KafkaPort = "9093"

// ErrNoEndpoint is returned by Brokers for a connection string without an
// Endpoint=sb://… part.
var ErrNoEndpoint = errors.New("eventhubs: connection string has no Endpoint=sb://HOST/")

// Brokers returns the Kafka bootstrap address of the namespace named in
// connectionString's Endpoint: HOST:9093.
func Brokers(connectionString string) ([]string, error) {
	for part := range strings.SplitSeq(connectionString, ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(part), "=")
		if !strings.EqualFold(name, "Endpoint") {
			continue
		}
		u, err := url.Parse(value)
		if err != nil || u.Hostname() == "" {
			return nil, fmt.Errorf("%w: %q", ErrNoEndpoint, value)
		}
		return []string{u.Hostname() + ":" + KafkaPort}, nil
	}
	return nil, ErrNoEndpoint
}

// SaramaConfig sets sc up for an Event Hubs Kafka endpoint and returns it:
// SASL PLAIN with the user "$ConnectionString" and connectionString as the
// password, TLS on (the endpoint accepts nothing else), and a protocol
// Version of at least Kafka 1.0.0, the oldest Event Hubs supports (sc's
// own when newer). Leave TLS on for Azure; the tests turn it off only
// because kfake listens in plain text here.
func SaramaConfig(sc *sarama.Config, connectionString string) *sarama.Config {
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	sc.Net.SASL.User = ConnectionStringUser
	sc.Net.SASL.Password = connectionString
	sc.Net.TLS.Enable = true
	if sc.Net.TLS.Config == nil {
		sc.Net.TLS.Config = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if !sc.Version.IsAtLeast(sarama.V1_0_0_0) {
		sc.Version = sarama.V1_0_0_0
	}
	return sc
}
