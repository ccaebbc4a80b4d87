package middleware_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/middleware"
)

func TestKeyFuncs(t *testing.T) {
	msg := func(payload string, md map[string]string) *message.Message {
		m := message.NewMessage("the-uuid", []byte(payload))
		for k, v := range md {
			m.Metadata.Set(k, v)
		}
		return m
	}
	for name, tc := range map[string]struct {
		key     middleware.KeyFunc
		msg     *message.Message
		want    string
		wantErr string
	}{
		"uuid":                 {middleware.UUIDKey, msg("", nil), "the-uuid", ""},
		"uuid empty":           {middleware.UUIDKey, message.NewMessage("", nil), "", "UUID is empty"},
		"metadata":             {middleware.MetadataKey("idempotency_key"), msg("", map[string]string{"idempotency_key": "k-1"}), "k-1", ""},
		"metadata missing":     {middleware.MetadataKey("idempotency_key"), msg("", nil), "", `"idempotency_key" is empty or missing`},
		"cloudevents ce_":      {middleware.CloudEventsKey, msg("", map[string]string{"ce_source": "src", "ce_id": "1"}), "3:src:1", ""},
		"cloudevents ce-":      {middleware.CloudEventsKey, msg("", map[string]string{"ce-source": "src", "ce-id": "1"}), "3:src:1", ""},
		"cloudevents amqp":     {middleware.CloudEventsKey, msg("", map[string]string{"cloudEvents:source": "src", "cloudEvents:id": "1"}), "3:src:1", ""},
		"cloudevents no id":    {middleware.CloudEventsKey, msg("", map[string]string{"ce_source": "src"}), "", "source and id attributes are required"},
		"cloudevents no clash": {middleware.CloudEventsKey, msg("", map[string]string{"ce_source": "a:b", "ce_id": "c"}), "3:a:b:c", ""},
		"json string":          {middleware.JSONFieldKey("id"), msg(`{"id":"o-1"}`, nil), "o-1", ""},
		"json number":          {middleware.JSONFieldKey("id"), msg(`{"id":12345678901234567890}`, nil), "12345678901234567890", ""},
		"json nested":          {middleware.JSONFieldKey("a", "b"), msg(`{"a":{"b":"x"}}`, nil), "x", ""},
		"json missing":         {middleware.JSONFieldKey("id"), msg(`{"other":1}`, nil), "", `"id" is missing`},
		"json not object":      {middleware.JSONFieldKey("a", "b"), msg(`{"a":"str"}`, nil), "", "not a JSON object"},
		"json bool":            {middleware.JSONFieldKey("id"), msg(`{"id":true}`, nil), "", "must be a string or a number"},
		"json invalid":         {middleware.JSONFieldKey("id"), msg(`not json`, nil), "", "not a JSON object"},
		"json no path":         {middleware.JSONFieldKey(), msg(`{}`, nil), "", "needs a field path"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := tc.key(tc.msg)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	// "a:b"+"c" and "a"+"b:c" must not produce the same key.
	k1, _ := middleware.CloudEventsKey(msg("", map[string]string{"ce_source": "a:b", "ce_id": "c"}))
	k2, _ := middleware.CloudEventsKey(msg("", map[string]string{"ce_source": "a", "ce_id": "b:c"}))
	require.NotEqual(t, k1, k2)
}
