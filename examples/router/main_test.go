package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
)

// README.md quotes main.go between these markers, byte for byte.
const (
	readmeBegin = "<!-- begin examples/router/main.go -->\n```go\n"
	readmeEnd   = "```\n<!-- end examples/router/main.go -->"
)

func TestREADMEQuotesMain(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	main, err := os.ReadFile("main.go")
	require.NoError(t, err)

	_, rest, ok := bytes.Cut(readme, []byte(readmeBegin))
	require.True(t, ok, "README.md lacks %q", readmeBegin)
	quoted, _, ok := bytes.Cut(rest, []byte(readmeEnd))
	require.True(t, ok, "README.md lacks %q", readmeEnd)
	require.Equal(t, string(main), string(quoted), "README.md must quote examples/router/main.go exactly: paste the file between the markers")
}

// TestRun runs the service against the real PostgreSQL, in a schema of its
// own (the DSN's search_path), and feeds it what a broker delivers: two
// orders, a redelivered copy of one, a malformed order and a reused key.
func TestRun(t *testing.T) {
	dsn := testenv.PostgresSchemaDSN(t, "router_example_")
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	defer db.Close()

	logger := watermill.NopLogger{}
	// Persistent: messages published before the router subscribes wait.
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer pubSub.Close()
	payments, err := pubSub.Subscribe(t.Context(), "payments")
	require.NoError(t, err)
	poisoned, err := pubSub.Subscribe(t.Context(), "orders.poison")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- run(runCtx, dsn, pubSub, pubSub, logger) }()

	next := func(ch <-chan *message.Message) *message.Message {
		t.Helper()
		select {
		case m := <-ch:
			m.Ack()
			return m
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for a message")
		}
		return nil
	}
	// GoChannel does not keep the order of messages in flight together, so
	// each is published once the previous one has had its effect.
	deliver := func(uuid, payload string, effects <-chan *message.Message) *message.Message {
		t.Helper()
		require.NoError(t, pubSub.Publish("orders", message.NewMessage(uuid, []byte(payload))))
		return next(effects)
	}
	const uuid1, uuid2 = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
	first1 := deliver(uuid1, `{"id":"order-1","cents":1200}`, payments)
	require.JSONEq(t, `{"id":"order-1","cents":1200}`, string(first1.Payload))
	first2 := deliver(uuid2, `{"id":"order-2","cents":550}`, payments)
	require.JSONEq(t, `{"id":"order-2","cents":550}`, string(first2.Payload))
	replayed := deliver(uuid1, `{"id":"order-1","cents":1200}`, payments) // redelivered
	require.Equal(t, first1.UUID, replayed.UUID, "the duplicate replays the stored payment with its UUID")
	malformed := watermill.NewUUID()
	require.Equal(t, malformed, deliver(malformed, `{"id":`, poisoned).UUID, "a malformed order is poisoned")
	require.Equal(t, uuid2, deliver(uuid2, `{"id":"order-2","cents":99999}`, poisoned).UUID, "a reused key is poisoned")

	stop()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("run did not return after its context ended")
	}

	rows, err := db.QueryContext(ctx, `SELECT order_id, cents FROM charges ORDER BY order_id`)
	require.NoError(t, err)
	defer rows.Close()
	charges := map[string]int64{}
	n := 0
	for rows.Next() {
		var id string
		var cents int64
		require.NoError(t, rows.Scan(&id, &cents))
		charges[id] = cents
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 2, n, "one charge per order")
	require.Equal(t, map[string]int64{"order-1": 1200, "order-2": 550}, charges)
}
