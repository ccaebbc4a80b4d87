// Package resultcodec is the stored form of a handler's result: the
// messages an inbox replays to duplicates. The middleware writes it, the
// repository validates what an operator stores with Resolve, and neither
// may import the other, so the format lives here, once: a leaf that
// imports only the standard library, which the storage contracts may
// import. Programs use middleware.EncodeResult and DecodeResult.
//
// Version 2 (written since) is length-prefixed binary and byte-exact:
// UUIDs, metadata keys and values and payloads come back exactly as they
// were, whatever bytes they hold (JSON, the version 1 format, replaced
// invalid UTF-8 with U+FFFD, so a replayed UUID could differ from the
// original). Version 1 records are still decoded.
//
//	b, _ := resultcodec.Encode([]resultcodec.Message{{UUID: "out-1", Payload: []byte("paid")}})
//	msgs, err := resultcodec.Decode(b) // the same message, byte for byte
package resultcodec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// Message is one stored output message.
type Message struct {
	UUID     string
	Metadata map[string]string
	Payload  []byte
}

// ErrInvalid is wrapped by every Decode error: the bytes are not a result
// this package wrote.
var ErrInvalid = errors.New("invalid stored result")

// version2 is the first byte of a version 2 result. A version 1 result is
// a JSON object and starts with '{'.
const version2 = 2

// Encode returns the version 2 form of msgs, or nil for no messages (so a
// handler without output stores nothing). Metadata is written in key
// order, so equal messages encode to equal bytes.
func Encode(msgs []Message) []byte {
	if len(msgs) == 0 {
		return nil
	}
	n := 1 + binary.MaxVarintLen64
	for _, m := range msgs {
		n += 3*binary.MaxVarintLen64 + len(m.UUID) + len(m.Payload)
		for k, v := range m.Metadata {
			n += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, version2)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		b = appendBytes(b, m.UUID)
		keys := make([]string, 0, len(m.Metadata))
		for k := range m.Metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = binary.AppendUvarint(b, uint64(len(keys)))
		for _, k := range keys {
			b = appendBytes(b, k)
			b = appendBytes(b, m.Metadata[k])
		}
		b = appendBytes(b, string(m.Payload))
	}
	return b
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode reads a result written by Encode (version 2) or by the version 1
// JSON encoder. Empty input is no messages. Anything else — truncated or
// trailing bytes, an unknown version, a repeated metadata key — is an
// error wrapping ErrInvalid; Decode never panics and allocates no more
// than the input's size suggests.
func Decode(b []byte) ([]Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	switch b[0] {
	case version2:
		return decodeV2(b[1:])
	case '{':
		return decodeV1(b)
	default:
		return nil, fmt.Errorf("%w: unknown format (first byte %#x)", ErrInvalid, b[0])
	}
}

// Validate reports whether b is a result Decode accepts.
func Validate(b []byte) error {
	_, err := Decode(b)
	return err
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = fmt.Errorf("%w: bad length of %s", ErrInvalid, what)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes(what string) []byte {
	n := r.uvarint(what)
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("%w: %s of %d bytes, only %d left", ErrInvalid, what, n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func decodeV2(b []byte) ([]Message, error) {
	r := &reader{b: b}
	count := r.uvarint("message count")
	// Every message takes at least three bytes (three empty lengths):
	// a count beyond that is corrupt, and must not size an allocation.
	if r.err == nil && count > uint64(len(r.b))/3 {
		return nil, fmt.Errorf("%w: %d messages cannot fit in %d bytes", ErrInvalid, count, len(r.b))
	}
	if r.err == nil && count == 0 {
		return nil, fmt.Errorf("%w: no messages (no output is stored as an empty result)", ErrInvalid)
	}
	msgs := make([]Message, 0, count)
	for i := uint64(0); i < count && r.err == nil; i++ {
		var m Message
		m.UUID = string(r.bytes("uuid"))
		pairs := r.uvarint("metadata count")
		if r.err == nil && pairs > uint64(len(r.b))/2 {
			return nil, fmt.Errorf("%w: %d metadata entries cannot fit in %d bytes", ErrInvalid, pairs, len(r.b))
		}
		if pairs > 0 {
			m.Metadata = make(map[string]string, pairs)
		}
		for j := uint64(0); j < pairs && r.err == nil; j++ {
			k := string(r.bytes("metadata key"))
			v := string(r.bytes("metadata value"))
			if _, dup := m.Metadata[k]; dup && r.err == nil {
				r.err = fmt.Errorf("%w: metadata key %q repeated", ErrInvalid, k)
			}
			m.Metadata[k] = v
		}
		if p := r.bytes("payload"); r.err == nil {
			m.Payload = append([]byte{}, p...)
		}
		msgs = append(msgs, m)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) > 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrInvalid, len(r.b))
	}
	return msgs, nil
}

// v1Result is the version 1 format: JSON, which is not byte-exact for
// strings that are not valid UTF-8.
type v1Result struct {
	Version  int         `json:"v"`
	Messages []v1Message `json:"messages"`
}

type v1Message struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

func decodeV1(b []byte) ([]Message, error) {
	var r v1Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%w: version 1 JSON: %w", ErrInvalid, err)
	}
	if r.Version != 1 {
		return nil, fmt.Errorf("%w: unknown format version %d", ErrInvalid, r.Version)
	}
	msgs := make([]Message, len(r.Messages))
	for i, m := range r.Messages {
		msgs[i] = Message(m)
	}
	return msgs, nil
}

// EncodeV1 writes the version 1 JSON format. It exists so tests can prove
// that records written before version 2 still replay; nothing writes it.
func EncodeV1(msgs []Message) ([]byte, error) {
	r := v1Result{Version: 1, Messages: make([]v1Message, len(msgs))}
	for i, m := range msgs {
		r.Messages[i] = v1Message(m)
	}
	return json.Marshal(r)
}
