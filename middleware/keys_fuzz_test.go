package middleware_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/middleware"
)

// FuzzMetadataKey: the key is the field's value exactly, and no value is
// an error (never an empty key).
func FuzzMetadataKey(f *testing.F) {
	f.Add("idempotency_key", "k-1")
	f.Add("", "")
	f.Add("k\xff", "v\x00\xfe")
	f.Fuzz(func(t *testing.T, field, value string) {
		msg := message.NewMessage("u", nil)
		msg.Metadata.Set(field, value)
		key, err := middleware.MetadataKey(field)(msg)
		if value == "" {
			if err == nil {
				t.Fatalf("empty value %q gave key %q and no error", value, key)
			}
			return
		}
		if err != nil || key != value {
			t.Fatalf("field %q = %q: key %q, err %v", field, value, key, err)
		}
	})
}

var cePrefixes = []string{"ce_", "ce-", "cloudEvents:", "cloudEvents_"}

func cloudEvent(prefix int, source, id string) *message.Message {
	p := cePrefixes[uint(prefix)%uint(len(cePrefixes))]
	msg := message.NewMessage("u", nil)
	msg.Metadata.Set(p+"source", source)
	msg.Metadata.Set(p+"id", id)
	return msg
}

// FuzzCloudEventsKey: two events get the same key exactly when source and
// id are both equal, whatever header spelling carried them; the key reads
// back as "<len(source)>:<source>:<id>".
func FuzzCloudEventsKey(f *testing.F) {
	f.Add(0, "src", "1", 1, "src", "1")
	f.Add(0, "a:b", "c", 2, "a", "b:c")
	f.Add(3, "1:x", "y", 0, "1", "x:y")
	f.Add(1, "", "id", 0, "\xff", "\x00")
	f.Fuzz(func(t *testing.T, pa int, sa, ida string, pb int, sb, idb string) {
		ka, errA := middleware.CloudEventsKey(cloudEvent(pa, sa, ida))
		kb, errB := middleware.CloudEventsKey(cloudEvent(pb, sb, idb))
		if (errA == nil) != (sa != "" && ida != "") || (errB == nil) != (sb != "" && idb != "") {
			t.Fatalf("error iff source or id is empty: %v, %v", errA, errB)
		}
		if errA != nil || errB != nil {
			return
		}
		if (ka == kb) != (sa == sb && ida == idb) {
			t.Fatalf("(%q, %q) -> %q and (%q, %q) -> %q", sa, ida, ka, sb, idb, kb)
		}
		n, rest, ok := strings.Cut(ka, ":")
		length, err := strconv.Atoi(n)
		if !ok || err != nil || length != len(sa) || len(rest) <= length || rest[:length] != sa || rest[length] != ':' || rest[length+1:] != ida {
			t.Fatalf("key %q does not read back as source %q, id %q", ka, sa, ida)
		}
	})
}

// FuzzCloudEventsHeaders: any pair of headers never panics, and a key is
// only ever built from the headers' values.
func FuzzCloudEventsHeaders(f *testing.F) {
	f.Add("ce_source", "src", "ce_id", "1")
	f.Add("ce-source", "s", "cloudEvents_id", "i")
	f.Add("cloudEvents:source", "", "ce_id", "x")
	f.Fuzz(func(t *testing.T, h1, v1, h2, v2 string) {
		msg := message.NewMessage("u", nil)
		msg.Metadata.Set(h1, v1)
		msg.Metadata.Set(h2, v2)
		key, err := middleware.CloudEventsKey(msg)
		if err != nil {
			return
		}
		if !strings.Contains(key, v1) && !strings.Contains(key, v2) {
			t.Fatalf("key %q from headers %q=%q, %q=%q", key, h1, v1, h2, v2)
		}
	})
}

// FuzzJSONFieldKey: arbitrary payloads and paths never panic; a string
// field is returned exactly; an integer by its JSON text.
func FuzzJSONFieldKey(f *testing.F) {
	f.Add("id", "o-1", int64(17), []byte(`{"id":"o-1"}`))
	f.Add("", "", int64(-1), []byte(`{"a":{"b":"x"}}`))
	f.Add("\u0000", "k\u0000", int64(0), []byte(`{"\u0000":"x"}`))
	f.Add("a.b", "\xff", int64(1<<62), []byte(`not json`))
	f.Fuzz(func(t *testing.T, field, value string, number int64, payload []byte) {
		_, _ = middleware.JSONFieldKey(field)(message.NewMessage("u", payload))
		_, _ = middleware.JSONFieldKey(field, value)(message.NewMessage("u", payload))

		if !utf8.ValidString(field) || !utf8.ValidString(value) {
			return // JSON would carry U+FFFD instead: not the same string
		}
		b, err := json.Marshal(map[string]any{field: value})
		if err != nil {
			t.Fatal(err)
		}
		if key, err := middleware.JSONFieldKey(field)(message.NewMessage("u", b)); err != nil || key != value {
			t.Fatalf("%s: key %q, err %v; want %q", b, key, err, value)
		}
		b, err = json.Marshal(map[string]any{field: number})
		if err != nil {
			t.Fatal(err)
		}
		if key, err := middleware.JSONFieldKey(field)(message.NewMessage("u", b)); err != nil || key != strconv.FormatInt(number, 10) {
			t.Fatalf("%s: key %q, err %v; want %d", b, key, err, number)
		}
	})
}
