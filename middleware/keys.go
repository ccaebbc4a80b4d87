package middleware

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// KeyFunc extracts the deduplication key of a message. The key must be
// stable across redeliveries of the same logical message: assigned by the
// producer, never by the transport (delivery tags, offsets, redelivery
// counters and receive timestamps change on every redelivery). Returning
// an empty key or an error makes the delivery fail with idempotency.ErrNoKey.
type KeyFunc func(msg *message.Message) (string, error)

// UUIDKey uses the Watermill message UUID, assigned by the producer when
// it creates the message. It is the default: correct whenever producers
// keep the UUID on retries (Watermill publishers do; an outbox relay does).
// A message from a producer that is not Watermill has an empty UUID
// unless the subscriber's unmarshaler fills it from the producer's own
// message id (keysource/amqpkeys, keysource/kafkakeys); an empty UUID is
// an error, and the delivery fails with idempotency.ErrNoKey.
func UUIDKey(msg *message.Message) (string, error) {
	if msg.UUID == "" {
		return "", errors.New("message UUID is empty: the producer set none, or the unmarshaler did not read it " +
			"(for producers that are not Watermill see keysource/amqpkeys and keysource/kafkakeys)")
	}
	return msg.UUID, nil
}

// MetadataKey reads the key from a metadata field, for example a broker
// message id that the subscriber's unmarshaler copies into metadata, or an
// application header such as "idempotency_key".
func MetadataKey(field string) KeyFunc {
	return func(msg *message.Message) (string, error) {
		v := msg.Metadata.Get(field)
		if v == "" {
			return "", fmt.Errorf("metadata field %q is empty or missing", field)
		}
		return v, nil
	}
}

// CloudEvents binary-mode attribute header spellings, by transport:
// Kafka and AMQP use "ce_", HTTP uses "ce-", and the AMQP spec also
// allows "cloudEvents:" / "cloudEvents_".
var cloudEventsPrefixes = []string{"ce_", "ce-", "cloudEvents:", "cloudEvents_"}

// CloudEventsKey identifies a CloudEvent by its source and id attributes,
// read from binary-mode headers in metadata ("ce_source"/"ce_id", or the
// "ce-", "cloudEvents:" and "cloudEvents_" spellings). The CloudEvents
// specification makes source+id unique per distinct event, and a producer
// resending an event keeps both. The key is "<len(source)>:<source>:<id>",
// which no other source/id pair can spell.
func CloudEventsKey(msg *message.Message) (string, error) {
	source, id := cloudEventsAttr(msg, "source"), cloudEventsAttr(msg, "id")
	if source == "" || id == "" {
		return "", fmt.Errorf("CloudEvents source and id attributes are required (got source %q, id %q)", source, id)
	}
	return strconv.Itoa(len(source)) + ":" + source + ":" + id, nil
}

func cloudEventsAttr(msg *message.Message, name string) string {
	for _, p := range cloudEventsPrefixes {
		if v := msg.Metadata.Get(p + name); v != "" {
			return v
		}
	}
	return ""
}

// JSONFieldKey reads a business key from the JSON payload at the given
// path of object fields, e.g. JSONFieldKey("order", "id") for
// {"order":{"id":"A-17"}}. Strings are used as they are; numbers by their
// JSON text (so 17 and 17.0 are different keys — producers should send
// one form). Any other type, a missing field or a payload that is not
// JSON is an error, and the delivery fails with idempotency.ErrNoKey.
func JSONFieldKey(path ...string) KeyFunc {
	where := strings.Join(path, ".")
	return func(msg *message.Message) (string, error) {
		if len(path) == 0 {
			return "", fmt.Errorf("JSONFieldKey needs a field path")
		}
		cur := json.RawMessage(msg.Payload)
		for _, field := range path {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(cur, &obj); err != nil {
				return "", fmt.Errorf("payload field %q: not a JSON object: %w", where, err)
			}
			next, ok := obj[field]
			if !ok {
				return "", fmt.Errorf("payload field %q is missing", where)
			}
			cur = next
		}
		var v any
		dec := json.NewDecoder(strings.NewReader(string(cur)))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return "", fmt.Errorf("payload field %q: %w", where, err)
		}
		switch v := v.(type) {
		case string:
			return v, nil
		case json.Number:
			return v.String(), nil
		default:
			return "", fmt.Errorf("payload field %q must be a string or a number, got %T", where, v)
		}
	}
}
