// Package kafkakeys makes Kafka records from producers that are not
// Watermill keyable by the inbox.
//
// watermill-kafka's DefaultMarshaler copies a record's headers into
// metadata but takes the message UUID only from its own
// "_watermill_message_uuid" header, so a record from a Java, Python or
// franz-go producer reaches the router with an empty UUID, and the
// inbox's default key, middleware.UUIDKey, fails it with the permanent
// idempotency.ErrNoKey. Unmarshaler fills the UUID from the producer's own
// identifier: a header you name, or a CloudEvent's source and id. One line
// of subscriber configuration:
//
//	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
//		Brokers:     brokers,
//		Unmarshaler: kafkakeys.Unmarshaler{KeyHeader: "message_id"},
//		// ...
//	}, logger)
//
// The record key is not a deduplication key: it names the entity a record
// is about (and picks its partition), so many records share it.
package kafkakeys

import (
	"encoding/json"
	"mime"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/middleware"
)

// CloudEvents Kafka protocol binding names: in binary mode each context
// attribute is a header "ce_<name>" and the data content type is the
// "content-type" header; in structured mode the whole event is the
// record's value and "content-type" is "application/cloudevents+json".
const (
	CloudEventsPrefix        = "ce_"
	ContentTypeHeader        = "content-type"
	CloudEventsJSONMediaType = "application/cloudevents+json"
)

// Unmarshaler is a watermill-kafka Unmarshaler for consumers of producers
// that are not Watermill. It unmarshals a record with Inner (default
// kafka.DefaultMarshaler{}: every header in metadata) and, when Inner
// found no Watermill UUID, sets the message UUID from the first of:
//
//  1. the KeyHeader header, when KeyHeader is set and the header is not
//     empty;
//  2. a CloudEvent's source and id: binary mode (the "ce_source" and
//     "ce_id" headers) or structured mode (a JSON event with
//     content-type application/cloudevents+json, whose id, source, type,
//     specversion, subject and time attributes are then also copied into
//     metadata as "ce_id", "ce_source", …). The UUID is the key
//     middleware.CloudEventsKey builds, so UUIDKey and CloudEventsKey
//     store the same key. The CloudEvents specification makes source+id
//     unique per event; id alone is not.
//
// Otherwise the UUID stays empty. Unmarshaler never invents one: a made-up
// UUID would make every redelivery look new, while an empty one fails the
// inbox with the permanent ErrNoKey, which the poison queue takes.
// Unmarshal fails only when Inner does (watermill-kafka stops consuming
// on that error); with the default Inner it never fails. Unmarshaler is
// safe for concurrent use when Inner is.
type Unmarshaler struct {
	// Inner decodes the record. Default: kafka.DefaultMarshaler{}.
	Inner kafka.Unmarshaler
	// KeyHeader names the header in which producers send their message
	// id ("message_id", "idempotency-key", …); it is also in metadata
	// under that name, for middleware.MetadataKey. Default: "" (none:
	// Watermill's header and CloudEvents only).
	KeyHeader string
}

var _ kafka.Unmarshaler = Unmarshaler{}

// Unmarshal turns a record into a message keyed by the producer's
// identifier; see Unmarshaler.
func (u Unmarshaler) Unmarshal(record *sarama.ConsumerMessage) (*message.Message, error) {
	inner := u.Inner
	if inner == nil {
		inner = kafka.DefaultMarshaler{}
	}
	msg, err := inner.Unmarshal(record)
	if err != nil {
		return nil, err
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	if msg.Metadata.Get(CloudEventsPrefix+"id") == "" && isStructuredCloudEvent(msg.Metadata.Get(ContentTypeHeader)) {
		copyStructuredAttributes(msg)
	}
	if msg.UUID == "" && u.KeyHeader != "" {
		msg.UUID = msg.Metadata.Get(u.KeyHeader)
	}
	if msg.UUID == "" {
		// Empty unless the record carries CloudEvents source and id.
		msg.UUID, _ = middleware.CloudEventsKey(msg)
	}
	return msg, nil
}

func isStructuredCloudEvent(contentType string) bool {
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && strings.EqualFold(mediaType, CloudEventsJSONMediaType)
}

// copyStructuredAttributes copies the string context attributes of a
// structured-mode JSON event into metadata under their binary-mode names.
// A value that is not a JSON object, or attributes that are not strings,
// are left out: the key functions then report them missing.
func copyStructuredAttributes(msg *message.Message) {
	var event map[string]json.RawMessage
	if json.Unmarshal(msg.Payload, &event) != nil {
		return
	}
	for _, name := range []string{"id", "source", "type", "specversion", "subject", "time"} {
		var v string
		if raw, ok := event[name]; ok && json.Unmarshal(raw, &v) == nil && v != "" {
			msg.Metadata.Set(CloudEventsPrefix+name, v)
		}
	}
}
