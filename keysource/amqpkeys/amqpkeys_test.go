package amqpkeys_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/keysourcetest"
	"github.com/idemkit/watermill-idempotent/keysource/amqpkeys"
)

func TestUnmarshalUUID(t *testing.T) {
	for name, tc := range map[string]struct {
		delivery amqp091.Delivery
		want     string
	}{
		"message_id": {amqp091.Delivery{MessageId: "m-1"}, "m-1"},
		"watermill header wins": {amqp091.Delivery{MessageId: "m-1",
			Headers: amqp091.Table{amqp.DefaultMessageUUIDHeaderKey: "w-1"}}, "w-1"},
		"cloudevents headers": {amqp091.Delivery{
			Headers: amqp091.Table{"cloudEvents:source": "/shop", "cloudEvents:id": "e-1"}}, "5:/shop:e-1"},
		"message_id before cloudevents": {amqp091.Delivery{MessageId: "m-1",
			Headers: amqp091.Table{"cloudEvents:source": "/shop", "cloudEvents:id": "e-1"}}, "m-1"},
		"nothing: empty, never invented": {amqp091.Delivery{CorrelationId: "c-1"}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			msg, err := amqpkeys.Marshaler{}.Unmarshal(tc.delivery)
			require.NoError(t, err)
			keysourcetest.RequireUUIDKey(t, msg, tc.want)
		})
	}
}

func TestUnmarshalMetadata(t *testing.T) {
	ts := time.Date(2026, 12, 1, 3, 4, 5, 0, time.FixedZone("CET", 3600))
	msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{
		MessageId:     "m-1",
		CorrelationId: "c-1",
		Type:          "order.placed",
		AppId:         "shop",
		ContentType:   "application/json",
		Timestamp:     ts,
		Headers: amqp091.Table{
			"message_id": "stale, copied from another message",
			"type":       "overwritten by the property",
			"app_header": "kept",
		},
		Body: []byte(`{"id":"o-1"}`),
	})
	require.NoError(t, err)
	require.Equal(t, message.Metadata{
		amqpkeys.MessageID:     "m-1",
		amqpkeys.CorrelationID: "c-1",
		amqpkeys.Type:          "order.placed",
		amqpkeys.AppID:         "shop",
		amqpkeys.ContentType:   "application/json",
		amqpkeys.Timestamp:     "2026-12-01T02:04:05Z",
		"app_header":           "kept",
	}, msg.Metadata)
	require.Equal(t, `{"id":"o-1"}`, string(msg.Payload))

	// Unset properties add nothing and leave headers of their name alone.
	msg, err = amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{Headers: amqp091.Table{"type": "from a header"}})
	require.NoError(t, err)
	require.Equal(t, message.Metadata{"type": "from a header"}, msg.Metadata)
}

// TestUnmarshalHeaderTypes: every AMQP field type amqp091-go decodes
// becomes a string, where DefaultMarshaler fails (and watermill-amqp
// would requeue the message forever).
func TestUnmarshalHeaderTypes(t *testing.T) {
	ts := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	headers := amqp091.Table{
		"bool":     true,
		"int8":     int8(-8),
		"byte":     byte(8),
		"int16":    int16(-16),
		"int32":    int32(32),
		"int64":    int64(-64),
		"float32":  float32(1.5),
		"float64":  0.1,
		"decimal":  amqp091.Decimal{Scale: 2, Value: -5},
		"decimal0": amqp091.Decimal{Scale: 0, Value: 12},
		"decimal3": amqp091.Decimal{Scale: 3, Value: 12345},
		"bytes":    []byte("raw"),
		"time":     ts,
		"void":     nil,
		"array":    []any{"a", int32(1), []byte("b")},
		"x-death": []any{amqp091.Table{
			"count": int64(1), "queue": "orders", "time": ts, "routing-keys": []any{"orders"},
		}},
	}
	_, err := amqp.DefaultMarshaler{}.Unmarshal(amqp091.Delivery{Headers: headers})
	require.Error(t, err, "DefaultMarshaler accepts non-string headers now: revisit this package")

	msg, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{MessageId: "m-1", Headers: headers})
	require.NoError(t, err)
	for field, want := range map[string]string{
		"bool":     "true",
		"int8":     "-8",
		"byte":     "8",
		"int16":    "-16",
		"int32":    "32",
		"int64":    "-64",
		"float32":  "1.5",
		"float64":  "0.1",
		"decimal":  "-0.05",
		"decimal0": "12",
		"decimal3": "12.345",
		"bytes":    "raw",
		"time":     "2026-12-01T00:00:00Z",
		"void":     "",
		"array":    `["a",1,"b"]`,
		"x-death":  `[{"count":1,"queue":"orders","routing-keys":["orders"],"time":"2026-12-01T00:00:00Z"}]`,
	} {
		require.Equal(t, want, msg.Metadata.Get(field), field)
	}
}

// TestMarshalRoundTrip: a Watermill publisher using Marshaler sets the
// message_id and correlation_id properties, so consumers that are not
// Watermill can deduplicate, and a Watermill consumer reads the same UUID
// and metadata back.
func TestMarshalRoundTrip(t *testing.T) {
	out := message.NewMessage("u-1", []byte("body"))
	out.Metadata.Set(amqpkeys.CorrelationID, "c-1")
	out.Metadata.Set("tenant", "acme")
	p, err := amqpkeys.Marshaler{}.Marshal(out)
	require.NoError(t, err)
	require.Equal(t, "u-1", p.MessageId)
	require.Equal(t, "c-1", p.CorrelationId)
	require.Equal(t, amqp091.Persistent, p.DeliveryMode)

	in, err := amqpkeys.Marshaler{}.Unmarshal(amqp091.Delivery{
		MessageId: p.MessageId, CorrelationId: p.CorrelationId, Headers: p.Headers, Body: p.Body,
	})
	require.NoError(t, err)
	require.Equal(t, "u-1", in.UUID)
	require.Equal(t, "acme", in.Metadata.Get("tenant"))
	require.Equal(t, "c-1", in.Metadata.Get(amqpkeys.CorrelationID))
	require.Equal(t, "u-1", in.Metadata.Get(amqpkeys.MessageID))

	// Properties Inner set are kept.
	p, err = amqpkeys.Marshaler{Inner: amqp.DefaultMarshaler{
		PostprocessPublishing: func(p amqp091.Publishing) amqp091.Publishing {
			p.MessageId = "set-by-inner"
			return p
		},
	}}.Marshal(out)
	require.NoError(t, err)
	require.Equal(t, "set-by-inner", p.MessageId)
}
