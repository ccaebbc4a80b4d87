package kafkakeys_test

import (
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/keysourcetest"
	"github.com/idemkit/watermill-idempotent/keysource/kafkakeys"
	"github.com/idemkit/watermill-idempotent/middleware"
)

func record(value string, headers ...string) *sarama.ConsumerMessage {
	r := &sarama.ConsumerMessage{Value: []byte(value)}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, &sarama.RecordHeader{Key: []byte(headers[i]), Value: []byte(headers[i+1])})
	}
	return r
}

const structured = `{"specversion":"1.0","id":"e-1","source":"/shop","type":"order.placed","time":"2026-12-01T02:41:10Z","data":{"id":"o-1"}}`

func TestUnmarshalUUID(t *testing.T) {
	ce := []string{"ce_specversion", "1.0", "ce_id", "e-1", "ce_source", "/shop"}
	for name, tc := range map[string]struct {
		u      kafkakeys.Unmarshaler
		record *sarama.ConsumerMessage
		want   string
	}{
		"key header":             {kafkakeys.Unmarshaler{KeyHeader: "message_id"}, record("", "message_id", "m-1"), "m-1"},
		"watermill header wins":  {kafkakeys.Unmarshaler{KeyHeader: "message_id"}, record("", kafka.UUIDHeaderKey, "w-1", "message_id", "m-1"), "w-1"},
		"key header unset":       {kafkakeys.Unmarshaler{}, record("", "message_id", "m-1"), ""},
		"key header empty value": {kafkakeys.Unmarshaler{KeyHeader: "message_id"}, record("", "message_id", ""), ""},
		"binary cloudevent":      {kafkakeys.Unmarshaler{}, record("", ce...), "5:/shop:e-1"},
		"key header before cloudevent": {kafkakeys.Unmarshaler{KeyHeader: "message_id"},
			record("", append([]string{"message_id", "m-1"}, ce...)...), "m-1"},
		"key header missing, cloudevent": {kafkakeys.Unmarshaler{KeyHeader: "message_id"}, record("", ce...), "5:/shop:e-1"},
		"cloudevent without source":      {kafkakeys.Unmarshaler{}, record("", "ce_id", "e-1"), ""},
		"structured cloudevent": {kafkakeys.Unmarshaler{},
			record(structured, "content-type", "application/cloudevents+json; charset=UTF-8"), "5:/shop:e-1"},
		"structured, not JSON":   {kafkakeys.Unmarshaler{}, record("{", "content-type", "application/cloudevents+json"), ""},
		"JSON, not a cloudevent": {kafkakeys.Unmarshaler{}, record(structured, "content-type", "application/json"), ""},
		"nothing":                {kafkakeys.Unmarshaler{}, record("body", "tenant", "acme"), ""},
	} {
		t.Run(name, func(t *testing.T) {
			msg, err := tc.u.Unmarshal(tc.record)
			require.NoError(t, err)
			keysourcetest.RequireUUIDKey(t, msg, tc.want)
			if strings.HasPrefix(tc.want, "5:") { // keyed as a CloudEvent
				ceKey, err := middleware.CloudEventsKey(msg)
				require.NoError(t, err)
				require.Equal(t, ceKey, msg.UUID, "UUIDKey and CloudEventsKey store different keys")
			}
		})
	}
}

// TestUnmarshalStructuredMetadata: a structured-mode event's attributes
// land in metadata under their binary-mode names; the value stays the
// whole event.
func TestUnmarshalStructuredMetadata(t *testing.T) {
	msg, err := kafkakeys.Unmarshaler{}.Unmarshal(record(structured, "content-type", "application/cloudevents+json"))
	require.NoError(t, err)
	for field, want := range map[string]string{
		"ce_id": "e-1", "ce_source": "/shop", "ce_type": "order.placed", "ce_specversion": "1.0",
		"ce_time": "2026-12-01T02:41:10Z", "ce_subject": "",
	} {
		require.Equal(t, want, msg.Metadata.Get(field), field)
	}
	require.Equal(t, structured, string(msg.Payload))

	// Binary-mode headers are not overwritten by a value that happens to
	// look like an event.
	msg, err = kafkakeys.Unmarshaler{}.Unmarshal(record(structured,
		"content-type", "application/cloudevents+json", "ce_id", "header-id", "ce_source", "/header"))
	require.NoError(t, err)
	require.Equal(t, "header-id", msg.Metadata.Get("ce_id"))
	require.Equal(t, "/header", msg.Metadata.Get("ce_source"))
}
