package middleware

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// storedResult is the replayable form of a handler's output messages. The
// version field lets the format evolve without misreading older records.
type storedResult struct {
	Version  int             `json:"v"`
	Messages []storedMessage `json:"messages"`
}

type storedMessage struct {
	UUID     string            `json:"uuid"`
	Metadata map[string]string `json:"metadata,omitempty"`
	Payload  []byte            `json:"payload"`
}

const resultVersion = 1

// encodeResult returns nil for no messages, so handlers without output
// need no extra write.
func encodeResult(msgs []*message.Message) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	r := storedResult{Version: resultVersion, Messages: make([]storedMessage, len(msgs))}
	for i, m := range msgs {
		r.Messages[i] = storedMessage{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode handler result: %w", err)
	}
	return b, nil
}

// decodeResult rebuilds the stored messages with their original UUIDs.
func decodeResult(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var r storedResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode stored result: %w", err)
	}
	if r.Version != resultVersion {
		return nil, fmt.Errorf("decode stored result: unknown format version %d", r.Version)
	}
	msgs := make([]*message.Message, len(r.Messages))
	for i, sm := range r.Messages {
		m := message.NewMessage(sm.UUID, sm.Payload)
		for k, v := range sm.Metadata {
			m.Metadata.Set(k, v)
		}
		msgs[i] = m
	}
	return msgs, nil
}
