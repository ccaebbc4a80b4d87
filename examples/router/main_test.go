package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
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

// TestDemo runs what `go run ./examples/router` runs, twice on one schema:
// each run sends order-2 twice with the same UUID and gets four payments,
// the two of order-2 with one UUID, and the charges table holds one row
// per order, after the second run too (its UUIDs are already processed).
func TestDemo(t *testing.T) {
	dsn := testenv.PostgresSchemaDSN(t, "router_demo_")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	const sent = `sent     00000000-0000-4000-8000-000000000001 {"id":"order-1","cents":1200}
sent     00000000-0000-4000-8000-000000000002 {"id":"order-2","cents":550}
sent     00000000-0000-4000-8000-000000000003 {"id":"order-3","cents":9900}
sent     00000000-0000-4000-8000-000000000002 {"id":"order-2","cents":550}
`
	const charged = `charged  order-1 $12.00
charged  order-2 $5.50
charged  order-3 $99.00
`
	paymentLine := regexp.MustCompile(`(?m)^payment  (\S+) (.*)$`)
	var first []string
	for run := range 2 {
		pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
		var out bytes.Buffer
		require.NoError(t, demo(ctx, dsn, pubSub, watermill.NopLogger{}, &out))
		require.NoError(t, pubSub.Close())
		t.Logf("run %d:\n%s", run+1, out.String())

		require.True(t, strings.HasPrefix(out.String(), sent), "the four orders are sent first")
		require.True(t, strings.HasSuffix(out.String(), charged), "one charge per order")
		var payments []string // "order UUID", sorted
		for _, m := range paymentLine.FindAllStringSubmatch(out.String(), -1) {
			payments = append(payments, m[2]+" "+m[1])
		}
		slices.Sort(payments)
		require.Len(t, payments, 4, "one payment per delivery")
		require.Equal(t, payments[1], payments[2], "order-2's two deliveries give one payment, with one UUID")
		if run == 0 {
			first = payments
		} else {
			require.Equal(t, first, payments, "the second run replays the first run's payments")
		}
	}
}
