package metrics_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/metrics"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// relayMetric returns the series of family name with relay="orders", or
// nil when there is none.
func relayMetric(t *testing.T, reg prometheus.Gatherer, name string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "relay" && l.GetValue() == "orders" {
					return m
				}
			}
		}
	}
	return nil
}

// failFirst fails the first Publish call, publishing nothing.
type failFirst struct {
	message.Publisher
	once sync.Once
}

func (p *failFirst) Publish(topic string, msgs ...*message.Message) error {
	failed := false
	p.once.Do(func() { failed = true })
	if failed {
		return errors.New("broker unavailable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestRelayMetrics runs a real relay over an outbox holding 10 messages
// that waited an hour and 15 fresh ones, with a broker failing once, and
// checks what a scrape reads afterwards.
func TestRelayMetrics(t *testing.T) {
	for _, backend := range []string{"postgres", "mariadb"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var (
				db       *sql.DB
				dialect  sqldialect.Dialect
				backdate string
			)
			var suffix [5]byte
			_, _ = rand.Read(suffix[:])
			table := "outbox_metrics_" + hex.EncodeToString(suffix[:])
			if backend == "postgres" {
				db, dialect = testenv.Postgres(t), sqldialect.PostgreSQL
				backdate = `UPDATE ` + table + ` SET created_at = created_at - INTERVAL '1 hour' WHERE topic = 'old'`
			} else {
				db, dialect = testenv.MySQL(t), sqldialect.MySQL
				backdate = `UPDATE ` + table + ` SET created_at = created_at - INTERVAL 1 HOUR WHERE topic = 'old'`
			}
			ob, err := outbox.New(outbox.Config{Dialect: dialect, Table: table})
			require.NoError(t, err)
			require.NoError(t, ob.Migrate(ctx, db))
			t.Cleanup(func() {
				_, _ = db.Exec(`DROP TABLE ` + table)
				_, _ = db.Exec(`DROP TABLE IF EXISTS ` + outbox.DeadLetterTableName(table))
				if dialect == sqldialect.PostgreSQL {
					_, _ = db.Exec(`DROP FUNCTION IF EXISTS ` + table + `_notify()`)
				}
			})

			start := time.Now()
			write := func(topic string, n int) {
				tx, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				for i := range n {
					msg := message.NewMessage(fmt.Sprintf("%s-%d", topic, i), []byte("{}"))
					require.NoError(t, ob.WriteTx(ctx, tx, outbox.Outgoing{Topic: topic, Message: msg}))
				}
				require.NoError(t, tx.Commit())
			}
			write("old", 10)
			_, err = db.Exec(backdate)
			require.NoError(t, err)
			write("new", 15)

			reg := prometheus.NewPedanticRegistry()
			m, err := metrics.New(metrics.Config{Registerer: reg})
			require.NoError(t, err)
			broker := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
			t.Cleanup(func() { _ = broker.Close() })
			relay, err := outbox.NewRelay(db, &failFirst{Publisher: broker}, outbox.RelayConfig{
				Dialect:         dialect,
				Table:           table,
				BatchSize:       10,
				RetryInterval:   10 * time.Millisecond,
				BacklogInterval: 5 * time.Millisecond,
				Name:            "orders",
				Observer:        m,
			})
			require.NoError(t, err)

			backlog, err := relay.Backlog(ctx)
			require.NoError(t, err)
			backlog.Relay = "orders" // as the relay's own samples carry it
			m.ObserveBacklog(ctx, backlog)
			require.Equal(t, 25.0, relayMetric(t, reg, "watermill_idempotent_outbox_backlog_messages").GetGauge().GetValue())
			require.GreaterOrEqual(t, relayMetric(t, reg, "watermill_idempotent_outbox_oldest_message_age_seconds").GetGauge().GetValue(), 3600.0)

			done := make(chan error, 1)
			go func() { done <- relay.Run(ctx) }()
			// Done: every message counted and a backlog sample taken
			// after the last commit (before it, the count is above 0).
			deadline := time.Now().Add(10 * time.Second)
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				published := relayMetric(t, reg, "watermill_idempotent_relay_published_messages_total").GetCounter().GetValue()
				backlog := relayMetric(t, reg, "watermill_idempotent_outbox_backlog_messages").GetGauge().GetValue()
				if published == 25 && backlog == 0 {
					break
				}
				if time.Now().After(deadline) {
					require.NoError(t, relay.Close())
					require.NoError(t, <-done)
					t.Fatalf("after 10s: %v published, backlog %v", published, backlog)
				}
				<-tick.C
			}
			require.NoError(t, relay.Close())
			require.NoError(t, <-done)
			elapsed := time.Since(start)

			require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP watermill_idempotent_relay_published_messages_total Messages an outbox relay published and acknowledged, by relay.
# TYPE watermill_idempotent_relay_published_messages_total counter
watermill_idempotent_relay_published_messages_total{relay="orders"} 25
# HELP watermill_idempotent_relay_failed_batches_total Outbox relay batches that failed (database or publisher error) and were retried, by relay.
# TYPE watermill_idempotent_relay_failed_batches_total counter
watermill_idempotent_relay_failed_batches_total{relay="orders"} 1
# HELP watermill_idempotent_outbox_backlog_messages Rows in the outbox table not yet acknowledged by a relay, as last sampled by the relay.
# TYPE watermill_idempotent_outbox_backlog_messages gauge
watermill_idempotent_outbox_backlog_messages{relay="orders"} 0
# HELP watermill_idempotent_outbox_oldest_message_age_seconds Age of the oldest row in the outbox table (database clock; 0 when empty), as last sampled by the relay.
# TYPE watermill_idempotent_outbox_oldest_message_age_seconds gauge
watermill_idempotent_outbox_oldest_message_age_seconds{relay="orders"} 0
`), "watermill_idempotent_relay_published_messages_total", "watermill_idempotent_relay_failed_batches_total",
				"watermill_idempotent_outbox_backlog_messages", "watermill_idempotent_outbox_oldest_message_age_seconds"))

			lag := relayMetric(t, reg, "watermill_idempotent_relay_lag_seconds").GetHistogram()
			require.EqualValues(t, 25, lag.GetSampleCount(), "one lag sample per published message")
			require.GreaterOrEqual(t, lag.GetSampleSum(), 10*3600.0)
			// Each lag is at most the window from the first write to the
			// end (elapsed) plus the part of a round trip between the
			// relay's clock reading and the fetch statement's start (bounded
			// here by elapsed again), plus the databases' whole microseconds.
			require.LessOrEqual(t, lag.GetSampleSum(), 10*3600+25*(2*elapsed+2*time.Microsecond).Seconds())
			var within1h uint64
			for _, b := range lag.GetBucket() {
				if b.GetUpperBound() == 3600 {
					within1h = b.GetCumulativeCount()
				}
			}
			require.EqualValues(t, 15, within1h, "the fresh messages waited under an hour, the backdated ones over")

			// The failed batch (10 claimed, none published), then 10, 10, 5;
			// the empty batch that ends the drain is not reported.
			batches := relayMetric(t, reg, "watermill_idempotent_relay_batch_duration_seconds").GetHistogram()
			require.EqualValues(t, 4, batches.GetSampleCount())
			require.LessOrEqual(t, batches.GetSampleSum(), elapsed.Seconds())
		})
	}
}

// A relay's series appear with its first backlog sample, which Run takes
// as it starts: its counters and histograms at 0, so rates start from
// there, and the gauges; none before, so a relay that never sampled does
// not claim an empty outbox.
func TestRelayObserverSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)
	names := []string{
		"watermill_idempotent_relay_published_messages_total",
		"watermill_idempotent_relay_failed_batches_total",
		"watermill_idempotent_relay_dead_lettered_messages_total",
		"watermill_idempotent_relay_dead_letter_failures_total",
		"watermill_idempotent_outbox_dead_letters",
		"watermill_idempotent_relay_lag_seconds",
		"watermill_idempotent_relay_batch_duration_seconds",
		"watermill_idempotent_outbox_backlog_messages",
		"watermill_idempotent_outbox_oldest_message_age_seconds",
	}
	count := func(want int) {
		t.Helper()
		for _, name := range names {
			n, err := testutil.GatherAndCount(reg, name)
			require.NoError(t, err)
			require.Equal(t, want, n, name)
		}
	}
	count(0)
	m.ObserveBacklog(t.Context(), outbox.Backlog{Relay: "orders", Messages: 3, OldestAge: 1500 * time.Millisecond, DeadLetters: 2})
	count(1)
	require.Equal(t, 1.5, relayMetric(t, reg, "watermill_idempotent_outbox_oldest_message_age_seconds").GetGauge().GetValue())
	require.Equal(t, 3.0, relayMetric(t, reg, "watermill_idempotent_outbox_backlog_messages").GetGauge().GetValue())
	require.Equal(t, 2.0, relayMetric(t, reg, "watermill_idempotent_outbox_dead_letters").GetGauge().GetValue())
	m.ObserveRelayBatch(t.Context(), outbox.RelayBatch{Relay: "orders", Claimed: 4, Published: 3, DeadLettered: 1})
	require.Equal(t, 1.0, relayMetric(t, reg, "watermill_idempotent_relay_dead_lettered_messages_total").GetCounter().GetValue())
	m.ObserveRelayBatch(t.Context(), outbox.RelayBatch{Relay: "orders", Claimed: 5, Published: 3, DeadLetterFailures: 2})
	require.Equal(t, 2.0, relayMetric(t, reg, "watermill_idempotent_relay_dead_letter_failures_total").GetCounter().GetValue())
	require.Equal(t, 1.0, relayMetric(t, reg, "watermill_idempotent_relay_dead_lettered_messages_total").GetCounter().GetValue())
}

// refuseAll refuses every Publish with a permanent error.
type refuseAll struct{ message.Publisher }

func (refuseAll) Publish(string, ...*message.Message) error {
	return outbox.Permanent(errors.New("message too large"))
}

// A real relay whose dead-letter table was dropped: the row due for it
// stays in the outbox, and each failed move is counted in
// relay_dead_letter_failures_total, not as a dead letter.
func TestRelayDeadLetterFailuresMetric(t *testing.T) {
	for _, backend := range []string{"postgres", "mariadb"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, dialect := testenv.Postgres(t), sqldialect.PostgreSQL
			if backend == "mariadb" {
				db, dialect = testenv.MySQL(t), sqldialect.MySQL
			}
			var suffix [5]byte
			_, _ = rand.Read(suffix[:])
			table := "outbox_metrics_" + hex.EncodeToString(suffix[:])
			ob, err := outbox.New(outbox.Config{Dialect: dialect, Table: table})
			require.NoError(t, err)
			require.NoError(t, ob.Migrate(ctx, db))
			t.Cleanup(func() {
				_, _ = db.Exec(`DROP TABLE ` + table)
				if dialect == sqldialect.PostgreSQL {
					_, _ = db.Exec(`DROP FUNCTION IF EXISTS ` + table + `_notify()`)
				}
			})
			_, err = db.Exec(`DROP TABLE ` + outbox.DeadLetterTableName(table))
			require.NoError(t, err)
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, ob.WriteTx(ctx, tx, outbox.Outgoing{Topic: "t", Message: message.NewMessage("poison", []byte("x"))}))
			require.NoError(t, tx.Commit())

			reg := prometheus.NewPedanticRegistry()
			m, err := metrics.New(metrics.Config{Registerer: reg})
			require.NoError(t, err)
			relay, err := outbox.NewRelay(db, refuseAll{}, outbox.RelayConfig{Dialect: dialect, Table: table, MaxAttempts: 1, Name: "orders", Observer: m})
			require.NoError(t, err)
			// Batch 1 publishes the row in a plain run, which fails as a
			// whole; batches 2 and 3 refuse it alone, charge it to
			// MaxAttempts and fail to move it.
			for range 3 {
				_, err := relay.ForwardBatch(ctx)
				require.Error(t, err)
			}
			var rows int
			require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&rows))
			require.Equal(t, 1, rows, "the row stays in the outbox")
			require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP watermill_idempotent_relay_dead_letter_failures_total Outbox rows due for the dead-letter table that a relay could not move there (the table dropped or not writable, a full disk); each stays in the outbox and is tried again, by relay.
# TYPE watermill_idempotent_relay_dead_letter_failures_total counter
watermill_idempotent_relay_dead_letter_failures_total{relay="orders"} 2
# HELP watermill_idempotent_relay_dead_lettered_messages_total Outbox rows a relay moved to the dead-letter table (refused by the publisher MaxAttempts times, or undecodable), by relay.
# TYPE watermill_idempotent_relay_dead_lettered_messages_total counter
watermill_idempotent_relay_dead_lettered_messages_total{relay="orders"} 0
`), "watermill_idempotent_relay_dead_letter_failures_total", "watermill_idempotent_relay_dead_lettered_messages_total"))
		})
	}
}
