// Package amqpkeys makes messages from AMQP 0-9-1 producers that are not
// Watermill keyable by the inbox.
//
// watermill-amqp's DefaultMarshaler takes a message's UUID only from its
// own "_watermill_message_uuid" header and drops the AMQP properties, so a
// message published by a Java, Python or plain amqp091-go client reaches
// the router with no UUID and none of the identifiers its producer set:
// the inbox has no key and fails every delivery with the permanent
// idempotency.ErrNoKey. Marshaler keeps them. One line of subscriber
// configuration keys every message by its standard message_id property,
// with the default middleware.UUIDKey:
//
//	config := amqp.NewDurableQueueConfig(url)
//	config.Marshaler = amqpkeys.Marshaler{}
//	sub, err := amqp.NewSubscriber(config, logger)
//
// or, to key by the property explicitly whatever the Watermill header
// says, middleware.Config{Key: middleware.MetadataKey(amqpkeys.MessageID)}.
package amqpkeys

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/watermill-idempotent/middleware"
)

// Metadata fields Marshaler.Unmarshal fills from the AMQP properties of a
// delivery, when the producer set them. The names are the properties'
// names in the AMQP 0-9-1 specification; CorrelationID is also the field
// Watermill's correlation-id middleware and this library's logs read.
const (
	MessageID     = "message_id"
	CorrelationID = wmiddleware.CorrelationIDMetadataKey // "correlation_id"
	Type          = "type"
	AppID         = "app_id"
	ContentType   = "content_type"
	// Timestamp is the timestamp property in RFC 3339, UTC
	// ("2026-12-01T02:41:10Z"); AMQP carries whole seconds.
	Timestamp = "timestamp"
)

// Marshaler is a watermill-amqp Marshaler for consumers of producers that
// are not Watermill. It wraps Inner (default amqp.DefaultMarshaler{}) and
// adds, when unmarshaling a delivery:
//
//   - the message_id, correlation_id, type, app_id, content_type and
//     timestamp properties in metadata (fields MessageID, CorrelationID,
//     Type, AppID, ContentType, Timestamp), each only when set. A
//     property overwrites an application header of the same name: it is
//     where AMQP clients put it, and a header copied from another
//     message's metadata may be stale;
//   - the message UUID: Watermill's UUID header when present, otherwise
//     the message_id property, otherwise a binary-mode CloudEvent's
//     source and id headers (the key middleware.CloudEventsKey builds),
//     otherwise empty. It never invents one: a made-up UUID would make
//     every redelivery look new, while an empty one fails the inbox with
//     the permanent ErrNoKey, which the poison queue takes;
//   - every application header as a string, whatever its AMQP type:
//     numbers and booleans in Go's strconv form, timestamps in RFC 3339,
//     byte arrays as their bytes, decimals as decimal text, tables and
//     arrays (RabbitMQ's x-death) as JSON, void as "". DefaultMarshaler
//     refuses a header that is not a string, and watermill-amqp answers
//     that error with a nack that requeues the message: it would be
//     redelivered forever.
//
// Unmarshal fails only when Inner does; with the default Inner it never
// fails. Marshal publishes what Inner publishes, plus the message_id
// property set to the message UUID and correlation_id to the
// CorrelationID metadata, when Inner left them empty, so consumers that
// are not Watermill can deduplicate too. Marshaler is safe for concurrent
// use when Inner is.
type Marshaler struct {
	// Inner does the rest of the marshaling. Default:
	// amqp.DefaultMarshaler{} (persistent delivery mode, UUID in the
	// "_watermill_message_uuid" header).
	Inner amqp.Marshaler
}

var _ amqp.Marshaler = Marshaler{}

func (m Marshaler) inner() amqp.Marshaler {
	if m.Inner == nil {
		return amqp.DefaultMarshaler{}
	}
	return m.Inner
}

// Marshal marshals msg with Inner, then sets the message_id property to
// msg.UUID and the correlation_id property to its CorrelationID metadata
// when Inner left them empty.
func (m Marshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	p, err := m.inner().Marshal(msg)
	if err != nil {
		return p, err
	}
	if p.MessageId == "" {
		p.MessageId = msg.UUID
	}
	if p.CorrelationId == "" {
		p.CorrelationId = msg.Metadata.Get(CorrelationID)
	}
	return p, nil
}

// Unmarshal turns a delivery into a message keyed by the producer's
// identifiers; see Marshaler.
func (m Marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	if len(d.Headers) > 0 {
		headers := make(amqp091.Table, len(d.Headers))
		for k, v := range d.Headers {
			headers[k] = HeaderString(v)
		}
		d.Headers = headers
	}
	msg, err := m.inner().Unmarshal(d)
	if err != nil {
		return nil, err
	}
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	set := func(field, value string) {
		if value != "" {
			msg.Metadata.Set(field, value)
		}
	}
	set(MessageID, d.MessageId)
	set(CorrelationID, d.CorrelationId)
	set(Type, d.Type)
	set(AppID, d.AppId)
	set(ContentType, d.ContentType)
	if !d.Timestamp.IsZero() {
		set(Timestamp, d.Timestamp.UTC().Format(time.RFC3339))
	}
	if msg.UUID == "" {
		msg.UUID = d.MessageId
	}
	if msg.UUID == "" {
		// Empty unless the message carries CloudEvents source and id.
		msg.UUID, _ = middleware.CloudEventsKey(msg)
	}
	return msg, nil
}

// HeaderString is the string Marshaler.Unmarshal stores in metadata for
// an AMQP header value of any type amqp091-go decodes (see Marshaler).
func HeaderString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	case bool:
		return strconv.FormatBool(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339)
	case amqp091.Decimal:
		return decimalString(v)
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(rv.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(rv.Uint(), 10)
	case reflect.Float32:
		return strconv.FormatFloat(rv.Float(), 'g', -1, 32)
	case reflect.Float64:
		return strconv.FormatFloat(rv.Float(), 'g', -1, 64)
	}
	b, err := json.Marshal(jsonable(v))
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// jsonable converts the values inside AMQP tables and arrays the way
// HeaderString converts a header, so nested byte arrays read as text
// rather than base64 and decimals as numbers.
func jsonable(v any) any {
	switch v := v.(type) {
	case amqp091.Table:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = jsonable(e)
		}
		return out
	case []byte, time.Time:
		return HeaderString(v)
	case amqp091.Decimal:
		return json.Number(decimalString(v))
	}
	return v
}

// decimalString writes Value × 10^-Scale in decimal notation.
func decimalString(d amqp091.Decimal) string {
	digits := strconv.FormatInt(int64(d.Value), 10)
	sign := ""
	if digits[0] == '-' {
		sign, digits = "-", digits[1:]
	}
	scale := int(d.Scale)
	if scale == 0 {
		return sign + digits
	}
	for len(digits) <= scale {
		digits = "0" + digits
	}
	return sign + digits[:len(digits)-scale] + "." + digits[len(digits)-scale:]
}
