package resultcodec_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/resultcodec"
)

func TestRoundTripIsByteExact(t *testing.T) {
	t.Parallel()
	in := []resultcodec.Message{
		{UUID: "out-\xff\xfe-1", Metadata: map[string]string{"k\xff": "v\x00\xc3", "": ""}, Payload: []byte("\xff\x00payload")},
		{UUID: "", Payload: nil},
	}
	out, err := resultcodec.Decode(resultcodec.Encode(in))
	require.NoError(t, err)
	require.Len(t, out, 2)
	require.Equal(t, "out-\xff\xfe-1", out[0].UUID)
	require.Equal(t, map[string]string{"k\xff": "v\x00\xc3", "": ""}, out[0].Metadata)
	require.Equal(t, []byte("\xff\x00payload"), out[0].Payload)
	require.Empty(t, out[1].Payload)
}

func TestNoMessagesIsEmpty(t *testing.T) {
	t.Parallel()
	require.Nil(t, resultcodec.Encode(nil))
	out, err := resultcodec.Decode(nil)
	require.NoError(t, err)
	require.Empty(t, out)
}

func TestVersion1StillDecodes(t *testing.T) {
	t.Parallel()
	// A record as the version 1 encoder wrote it.
	v1 := []byte(`{"v":1,"messages":[{"uuid":"out-1","metadata":{"order_id":"A-1"},"payload":"cGFpZA=="}]}`)
	out, err := resultcodec.Decode(v1)
	require.NoError(t, err)
	require.Equal(t, []resultcodec.Message{{UUID: "out-1", Metadata: map[string]string{"order_id": "A-1"}, Payload: []byte("paid")}}, out)
}

func TestDecodeRefusesWhatEncodeNeverWrites(t *testing.T) {
	t.Parallel()
	valid := resultcodec.Encode([]resultcodec.Message{{UUID: "u", Metadata: map[string]string{"a": "b"}, Payload: []byte("p")}})
	for name, b := range map[string][]byte{
		"free text":         []byte("charged"),
		"empty JSON object": []byte("{}"),
		"JSON of version 2": []byte(`{"v":2,"messages":[]}`),
		"JSON trailing":     []byte(`{"v":1,"messages":[]} x`),
		"truncated":         valid[:len(valid)-1],
		"trailing byte":     append(bytes.Clone(valid), 0),
		"zero messages":     {2, 0},
		"huge count":        {2, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"repeated key":      {2, 1, 0, 2, 1, 'a', 0, 1, 'a', 0, 0},
	} {
		_, err := resultcodec.Decode(b)
		require.ErrorIs(t, err, resultcodec.ErrInvalid, name)
		require.ErrorIs(t, resultcodec.Validate(b), resultcodec.ErrInvalid, name)
	}
	require.NoError(t, resultcodec.Validate(valid))
}

// FuzzRoundTrip: whatever bytes a message holds, Decode(Encode(m)) gives
// them back exactly.
func FuzzRoundTrip(f *testing.F) {
	f.Add("out-1", "order_id", "A-1", []byte("paid"), 1)
	f.Add("out-\xff\xfe-1", "k\xff", "v\x00", []byte{0xff, 0}, 3)
	f.Add("", "", "", []byte(nil), 0)
	f.Fuzz(func(t *testing.T, uuid, key, value string, payload []byte, n int) {
		n = 1 + abs(n)%4
		in := make([]resultcodec.Message, n)
		for i := range in {
			in[i] = resultcodec.Message{UUID: uuid + string(rune('a'+i)), Payload: payload}
			if i%2 == 0 {
				in[i].Metadata = map[string]string{key: value, key + "\x00": value + value}
			}
		}
		b := resultcodec.Encode(in)
		out, err := resultcodec.Decode(b)
		if err != nil {
			t.Fatalf("decode of an encoded result: %v", err)
		}
		if len(out) != len(in) {
			t.Fatalf("%d messages in, %d out", len(in), len(out))
		}
		for i := range in {
			if out[i].UUID != in[i].UUID || !bytes.Equal(out[i].Payload, in[i].Payload) || len(out[i].Metadata) != len(in[i].Metadata) {
				t.Fatalf("message %d: %+v in, %+v out", i, in[i], out[i])
			}
			for k, v := range in[i].Metadata {
				if got, ok := out[i].Metadata[k]; !ok || got != v {
					t.Fatalf("message %d: metadata %q = %q in, %q (present %t) out", i, k, v, got, ok)
				}
			}
		}
		if !bytes.Equal(resultcodec.Encode(out), b) {
			t.Fatal("encoding is not deterministic")
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -(n + 1)
	}
	return n
}

// FuzzDecode: arbitrary bytes never panic; whatever decodes re-encodes to
// a result that decodes to the same messages.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(nil))
	f.Add([]byte("charged"))
	f.Add([]byte("{}"))
	f.Add([]byte(`{"v":1,"messages":[{"uuid":"out-1","metadata":{"a":"b"},"payload":"cGFpZA=="}]}`))
	f.Add(resultcodec.Encode([]resultcodec.Message{{UUID: "u", Metadata: map[string]string{"a": "b"}, Payload: []byte("p")}}))
	f.Add([]byte{2, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := resultcodec.Decode(b)
		if err != nil {
			return
		}
		again, err := resultcodec.Decode(resultcodec.Encode(msgs))
		if err != nil {
			t.Fatalf("re-encoded result does not decode: %v", err)
		}
		if len(again) != len(msgs) {
			t.Fatalf("%d messages, %d after a round trip", len(msgs), len(again))
		}
		for i := range msgs {
			if again[i].UUID != msgs[i].UUID || !bytes.Equal(again[i].Payload, msgs[i].Payload) || len(again[i].Metadata) != len(msgs[i].Metadata) {
				t.Fatalf("message %d changed in a round trip: %+v, %+v", i, msgs[i], again[i])
			}
		}
	})
}
