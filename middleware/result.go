package middleware

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/resultcodec"
)

// DefaultMaxResultBytes is the default largest stored result: 1 MiB. The
// stored result travels in one statement, and MySQL and MariaDB refuse a
// packet above max_allowed_packet (16 MiB by default on MariaDB 10.11 and
// MySQL 8) by resetting the connection — a failure that looks transient
// and repeats on every redelivery. 1 MiB stays far below it with room for
// the rest of the row, and matches the message size most brokers accept
// by default (Kafka's message.max.bytes is about 1 MB), which the replayed
// messages must pass through anyway.
const DefaultMaxResultBytes = 1 << 20

// EncodeResult returns the stored form of msgs — what the inbox keeps to
// replay to duplicates — or nil for no messages. UUIDs, metadata and
// payloads are kept byte for byte. Use it to build the Result of an
// operator's repository.Operator.Resolve with ResolveComplete, so that
// later duplicates replay msgs:
//
//	result, err := middleware.EncodeResult([]*message.Message{paid})
//	err = op.Resolve(ctx, repository.ResolveParams{..., Action: repository.ResolveComplete, Result: result})
//
// It never fails today; the error is there so the format may refuse
// input later without an API change.
func EncodeResult(msgs []*message.Message) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	stored := make([]resultcodec.Message, len(msgs))
	for i, m := range msgs {
		stored[i] = resultcodec.Message{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload}
	}
	return resultcodec.Encode(stored), nil
}

// DecodeResult rebuilds the messages of a stored result (Record.Result)
// with their original UUIDs, metadata and payloads. It reads every format
// version the inbox has written. An empty result is no messages.
func DecodeResult(b []byte) ([]*message.Message, error) {
	stored, err := resultcodec.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("decode stored result: %w", err)
	}
	if len(stored) == 0 {
		return nil, nil
	}
	msgs := make([]*message.Message, len(stored))
	for i, sm := range stored {
		m := message.NewMessage(sm.UUID, sm.Payload)
		for k, v := range sm.Metadata {
			m.Metadata.Set(k, v)
		}
		msgs[i] = m
	}
	return msgs, nil
}

// encodeResult encodes msgs and refuses a result above maxBytes with the
// permanent idempotency.ErrResultTooLarge; maxBytes < 0 means no limit.
func encodeResult(msgs []*message.Message, maxBytes int) ([]byte, error) {
	b, err := EncodeResult(msgs)
	if err != nil {
		return nil, err
	}
	if maxBytes >= 0 && len(b) > maxBytes {
		return nil, fmt.Errorf("%w: %d messages encode to %d bytes, the limit (MaxResultBytes) is %d", idempotency.ErrResultTooLarge, len(msgs), len(b), maxBytes)
	}
	return b, nil
}
