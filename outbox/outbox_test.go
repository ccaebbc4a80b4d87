package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func TestConfigValidate(t *testing.T) {
	_, err := outbox.New(outbox.Config{})
	require.ErrorContains(t, err, "missing Config.Dialect")
	_, err = outbox.New(outbox.Config{Dialect: "oracle"})
	require.ErrorContains(t, err, "unknown Config.Dialect")
	for _, bad := range []string{`x"; DROP TABLE y; --`, "a.b.c", "1abc", "with space", strings.Repeat("a", 64)} {
		_, err = outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: bad})
		require.ErrorIs(t, err, repository.ErrInvalidTableName, bad)
		_, err = outbox.NewRelay(nil, nil, outbox.RelayConfig{Dialect: sqldialect.MySQL, Table: bad})
		require.Error(t, err)
	}
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.MySQL})
	require.NoError(t, err)
	require.Equal(t, outbox.DefaultTableName, ob.Config().Table)
}

// The business row and the outbox rows commit or roll back together, and
// a non-JSON payload (protobuf-like, with NUL bytes) survives byte for
// byte, with UUID, metadata and topic.
func TestCommitAndRollbackTogether(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		orders := "orders_" + randomSuffix()
		_, err := b.db.Exec(`CREATE TABLE ` + orders + ` (id VARCHAR(64) NOT NULL PRIMARY KEY)`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = b.db.Exec(`DROP TABLE ` + orders) })

		proto := []byte{0x08, 0x96, 0x01, 0x12, 0x00, 0x00, 0xff, 0xfe, 0x1a, 0x03, 'a', 0x00, 'b'}
		created := message.NewMessage("3d1f0c5e-0000-4000-8000-000000000001", proto)
		created.Metadata.Set("content-type", "application/x-protobuf")
		created.Metadata.Set("correlation_id", "corr-1")
		audit := message.NewMessage("3d1f0c5e-0000-4000-8000-000000000002", []byte(`{"order":"o-1"}`))
		empty := message.NewMessage("3d1f0c5e-0000-4000-8000-000000000003", nil)

		// Committed: the order, one message via the Watermill publisher
		// and two via WriteTx to two topics.
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, `INSERT INTO `+orders+` (id) VALUES (`+b.ph(1)+`)`, "o-1")
		require.NoError(t, err)
		require.NoError(t, b.outbox.InTx(tx).Publish("orders.created", created))
		require.NoError(t, b.outbox.WriteTx(ctx, tx,
			outbox.Outgoing{Topic: "audit", Message: audit},
			outbox.Outgoing{Topic: "audit", Message: empty}))
		require.NoError(t, tx.Commit())

		// Rolled back: neither the order nor its messages remain.
		tx, err = b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, `INSERT INTO `+orders+` (id) VALUES (`+b.ph(1)+`)`, "o-2")
		require.NoError(t, err)
		pub := b.outbox.InTx(tx)
		require.NoError(t, pub.Publish("orders.created"), "no messages: nothing to write")
		require.NoError(t, pub.Publish("orders.created", message.NewMessage("rolled-back-1", []byte{0})))
		require.NoError(t, b.outbox.WriteTx(ctx, tx, outbox.Outgoing{Topic: "audit", Message: message.NewMessage("rolled-back-2", nil)}))
		require.NoError(t, tx.Rollback())

		var n int
		require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM `+orders).Scan(&n))
		require.Equal(t, 1, n, "business rows")
		require.Equal(t, 3, b.outboxRows(t), "outbox rows")

		s := newSink(t, nil, "orders.created", "audit")
		relay, err := b.newRelay(s, b.relayConfig(), nil)
		require.NoError(t, err)
		published, err := relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, published)
		require.Equal(t, 0, b.outboxRows(t), "published rows are deleted")

		got := s.rec.deliveries()
		require.Len(t, got, 3)
		require.Equal(t, "orders.created", got[0].topic)
		require.Equal(t, created.UUID, got[0].msg.UUID)
		require.True(t, bytes.Equal(proto, got[0].msg.Payload), "payload %x", got[0].msg.Payload)
		require.Equal(t, "application/x-protobuf", got[0].msg.Metadata.Get("content-type"))
		require.Equal(t, "corr-1", got[0].msg.Metadata.Get("correlation_id"))
		require.Equal(t, "audit", got[1].topic)
		require.Equal(t, audit.UUID, got[1].msg.UUID)
		require.Equal(t, `{"order":"o-1"}`, string(got[1].msg.Payload))
		require.Equal(t, empty.UUID, got[2].msg.UUID)
		require.Empty(t, got[2].msg.Payload)
		t.Logf("%s: 1 business row + 3 outbox rows committed, rolled-back transaction left 0; relay delivered %d", b.name, len(got))
	})
}

// TestWriteTxRefusesWhatPostgresTextCannotHold: in every pgx query exec
// mode, through database/sql and pgxoutbox, a message UUID that
// PostgreSQL's text cannot hold (a NUL byte, invalid UTF-8) or that is
// too long for its column is refused before anything is written, with
// ErrInvalidMessage and as a data exception, so the inbox middleware
// poisons the delivery that wrote it instead of redelivering it forever.
// Sent, a NUL byte would be answered with 22021 in the extended protocol
// but with 08P01 in simple_protocol. Metadata and payloads of any bytes
// are stored: metadata as JSON, whose "\u0000" the json column keeps.
func TestWriteTxRefusesWhatPostgresTextCannotHold(t *testing.T) {
	forEachPostgresExecMode(t, func(t *testing.T, b backend) {
		for _, c := range []struct{ name, uuid string }{
			{"NUL byte", "m-\x00"},
			{"invalid UTF-8", "m-\xff"},
			{"NUL byte and invalid UTF-8", "m-\x00\xff"},
			{"256 bytes", strings.Repeat("u", 256)},
		} {
			// The valid message first: nothing is written when any is invalid.
			err := b.tryWrite("orders", message.NewMessage("ok", nil), message.NewMessage(c.uuid, nil))
			require.ErrorIs(t, err, outbox.ErrInvalidMessage, c.name)
			require.ErrorIs(t, err, repository.ErrDataException, c.name)
			require.True(t, idempotency.IsPermanent(fmt.Errorf("handler: %w", err)), "%s: %v", c.name, err)
		}
		require.Zero(t, b.outboxRows(t))

		m := message.NewMessage("m-1", []byte{0x00, 0xff, 'x'})
		m.Metadata.Set("note", "a\x00b")
		b.write(t, "orders", m)
		var payload []byte
		var metadata string
		require.NoError(t, b.db.QueryRow(`SELECT payload, metadata::text FROM `+b.table+` WHERE uuid = $1`, "m-1").Scan(&payload, &metadata))
		require.Equal(t, []byte(m.Payload), payload)
		var got map[string]string
		require.NoError(t, json.Unmarshal([]byte(metadata), &got))
		require.Equal(t, "a\x00b", got["note"])
	})
}

func TestWriteTxRejectsInvalidMessages(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		ok := message.NewMessage("ok", nil)
		for _, tc := range []struct {
			out  outbox.Outgoing
			want error
		}{
			{outbox.Outgoing{Topic: "", Message: ok}, outbox.ErrInvalidTopic},
			{outbox.Outgoing{Topic: "a/b", Message: ok}, outbox.ErrInvalidTopic},
			{outbox.Outgoing{Topic: strings.Repeat("t", 256), Message: ok}, outbox.ErrInvalidTopic},
			{outbox.Outgoing{Topic: "t", Message: nil}, outbox.ErrInvalidMessage},
			{outbox.Outgoing{Topic: "t", Message: message.NewMessage("", nil)}, outbox.ErrInvalidMessage},
			{outbox.Outgoing{Topic: "t", Message: message.NewMessage(strings.Repeat("u", 256), nil)}, outbox.ErrInvalidMessage},
		} {
			// The valid message first: nothing is written when any is invalid.
			err := b.outbox.WriteTx(ctx, tx, outbox.Outgoing{Topic: "t", Message: ok}, tc.out)
			require.ErrorIs(t, err, tc.want)
		}
		require.ErrorIs(t, b.outbox.InTx(tx).Publish("", ok), outbox.ErrInvalidTopic)
		require.NoError(t, b.outbox.InTx(tx).Publish("t"), "publishing nothing is a no-op")
		require.NoError(t, tx.Commit())
		require.Equal(t, 0, b.outboxRows(t))
		require.Error(t, b.outbox.InTx(nil).Publish("t", ok))
		require.Error(t, b.outbox.WriteTx(ctx, nil, outbox.Outgoing{Topic: "t", Message: ok}))
	})
}

// failOnce fails the first Publish to topic, publishing nothing.
type failOnce struct {
	message.Publisher
	topic  string
	failed bool
}

func (p *failOnce) Publish(topic string, msgs ...*message.Message) error {
	if topic == p.topic && !p.failed {
		p.failed = true
		return errors.New("broker unavailable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// A publisher failing partway through a batch: what was published before
// is acknowledged, the rest stays and goes out on the next batch.
func TestPublisherFailsPartway(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		s := newSink(t, nil, "a", "b")
		b.write(t, "a", newMessages("a", 3)...)
		b.write(t, "b", newMessages("b", 2)...)
		b.write(t, "a", newMessages("a2", 1)...)

		relay, err := b.newRelay(&failOnce{Publisher: s, topic: "b"}, b.relayConfig(), nil)
		require.NoError(t, err)
		n, err := relay.ForwardBatch(ctx)
		require.ErrorContains(t, err, "broker unavailable")
		require.Equal(t, 3, n, "the first run of topic a is acknowledged")
		require.Equal(t, 3, b.outboxRows(t))

		n, err = relay.ForwardBatch(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Equal(t, 0, b.outboxRows(t))
		deliveries, distinct, dups := s.rec.stats()
		require.Equal(t, [3]int{6, 6, 0}, [3]int{deliveries, distinct, dups})
		var order []string
		for _, d := range s.rec.deliveries() {
			order = append(order, d.msg.UUID)
		}
		require.Equal(t, []string{"a-0000", "a-0001", "a-0002", "b-0000", "b-0001", "a2-0000"}, order, "id order kept across the retry")
	})
}

type countingMetrics struct {
	forwarded, failed chan any
}

func (m countingMetrics) forwardedBatch(s outbox.RelayBatch) { m.forwarded <- s }
func (m countingMetrics) failedBatch(err error)              { m.failed <- err }

func TestMetricsHooks(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		m := countingMetrics{forwarded: make(chan any, 10), failed: make(chan any, 10)}
		s := newSink(t, nil, "a", "b")
		b.write(t, "a", newMessages("a", 2)...)
		b.write(t, "b", newMessages("b", 2)...)
		cfg := b.relayConfig()
		cfg.Observer = m
		relay, err := b.newRelay(&failOnce{Publisher: s, topic: "b"}, cfg, nil)
		require.NoError(t, err)
		_, err = relay.ForwardBatch(context.Background())
		require.Error(t, err)
		require.Equal(t, outbox.RelayBatch{Claimed: 4, Published: 2}, zeroDuration(<-m.forwarded))
		require.ErrorContains(t, (<-m.failed).(error), "broker unavailable")
		_, err = relay.ForwardBatch(context.Background())
		require.NoError(t, err)
		require.Equal(t, outbox.RelayBatch{Claimed: 2, Published: 2}, zeroDuration(<-m.forwarded))
		_, err = relay.ForwardBatch(context.Background())
		require.NoError(t, err)
		require.Empty(t, m.forwarded, "an empty batch is not reported")
		require.Empty(t, m.failed)
	})
}

// zeroDuration drops the timing fields; metrics_test.go checks them.
func zeroDuration(v any) outbox.RelayBatch {
	s := v.(outbox.RelayBatch)
	s.Duration, s.Lag = 0, nil
	return s
}

// ObserveRelayBatch makes countingMetrics a RelayObserver.
func (m countingMetrics) ObserveRelayBatch(_ context.Context, b outbox.RelayBatch) {
	splitBatch(b, m.forwardedBatch, m.failedBatch)
}
