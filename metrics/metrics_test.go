package metrics_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/metrics"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// TestDeliveryMetrics drives every transactional outcome through an inbox
// and checks the exact counter values and histogram sample counts.
func TestDeliveryMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)

	db, err := sqlite.Open(filepath.Join(t.TempDir(), "m.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing", Observer: m})
	require.NoError(t, err)

	mw := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		switch string(msg.Payload) {
		case "fail":
			return nil, errors.New("boom")
		case "stale":
			return nil, fmt.Errorf("order 7 at version 3: %w", middleware.ErrStaleVersion)
		case "quiet":
			return nil, nil
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
	})
	deliver := func(uuid, payload string) error {
		_, err := mw(message.NewMessage(uuid, []byte(payload)))
		return err
	}
	require.NoError(t, deliver("a", "x"))     // processed
	require.NoError(t, deliver("a", "x"))     // replayed
	require.NoError(t, deliver("a", "x"))     // replayed
	require.NoError(t, deliver("b", "quiet")) // processed
	require.NoError(t, deliver("b", "quiet")) // duplicate (nothing to replay)
	require.Error(t, deliver("a", "other"))   // payload_mismatch
	require.Error(t, deliver("", "x"))        // no_key
	require.Error(t, deliver("c", "fail"))    // failed
	require.NoError(t, deliver("d", "stale")) // stale_version
	require.NoError(t, deliver("d", "stale")) // duplicate of the stale one

	want := map[idempotency.Outcome]float64{
		idempotency.OutcomeProcessed:       2,
		idempotency.OutcomeReplayed:        2,
		idempotency.OutcomeDuplicate:       2,
		idempotency.OutcomePayloadMismatch: 1,
		idempotency.OutcomeNoKey:           1,
		idempotency.OutcomeFailed:          1,
		idempotency.OutcomeStaleVersion:    1,
	}
	var total float64
	for outcome, n := range want {
		total += n
		got := testutil.ToFloat64(counter(t, reg, "watermill_idempotent_deliveries_total", "billing", string(outcome)))
		require.Equal(t, n, got, "deliveries_total{outcome=%q}", outcome)
	}
	require.Equal(t, 10.0, total)

	families, err := reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			if h := metric.GetHistogram(); h != nil {
				counts[f.GetName()] += h.GetSampleCount()
			}
		}
	}
	require.EqualValues(t, 9, counts["watermill_idempotent_claim_duration_seconds"], "every delivery with a key claims")
	require.EqualValues(t, 10, counts["watermill_idempotent_transaction_duration_seconds"])

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP watermill_idempotent_deliveries_total Deliveries handled by an inbox, by consumer and outcome (processed, duplicate, replayed, payload_mismatch, no_key, no_scope, stale_version, lease_busy, needs_intervention, failed).
# TYPE watermill_idempotent_deliveries_total counter
watermill_idempotent_deliveries_total{consumer="billing",outcome="duplicate"} 2
watermill_idempotent_deliveries_total{consumer="billing",outcome="failed"} 1
watermill_idempotent_deliveries_total{consumer="billing",outcome="no_key"} 1
watermill_idempotent_deliveries_total{consumer="billing",outcome="payload_mismatch"} 1
watermill_idempotent_deliveries_total{consumer="billing",outcome="processed"} 2
watermill_idempotent_deliveries_total{consumer="billing",outcome="replayed"} 2
watermill_idempotent_deliveries_total{consumer="billing",outcome="stale_version"} 1
`), "watermill_idempotent_deliveries_total"))
}

func TestTwoPhaseOutcomeMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)
	repo := memory.NewRepository()
	inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: repo, Consumer: "mailer", Observer: m})
	require.NoError(t, err)

	block := make(chan struct{})
	running := make(chan struct{})
	mw := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "slow" {
			close(running)
			<-block
		}
		return nil, nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := mw(message.NewMessage("k", []byte("slow")))
		done <- err
	}()
	<-running
	_, err = mw(message.NewMessage("k", []byte("slow")))
	require.ErrorIs(t, err, idempotency.ErrInProgress)
	close(block)
	require.NoError(t, <-done)

	require.Equal(t, 1.0, testutil.ToFloat64(counter(t, reg, "watermill_idempotent_deliveries_total", "mailer", "processed")))
	require.Equal(t, 1.0, testutil.ToFloat64(counter(t, reg, "watermill_idempotent_deliveries_total", "mailer", "lease_busy")))
}

func TestJanitorAndRecordMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg, Namespace: "custom"})
	require.NoError(t, err)
	m.ObserveJanitorBatch(t.Context(), janitor.Batch{Deleted: 1000})
	m.ObserveJanitorBatch(t.Context(), janitor.Batch{Deleted: 17})
	m.ObserveJanitorBatch(t.Context(), janitor.Batch{Err: errors.New("db gone")})
	m.SetRecords("payments", "stale", 3)

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP custom_janitor_deleted_records_total Expired inbox records deleted by the janitor.
# TYPE custom_janitor_deleted_records_total counter
custom_janitor_deleted_records_total 1017
# HELP custom_janitor_errors_total Janitor batches that failed.
# TYPE custom_janitor_errors_total counter
custom_janitor_errors_total 1
# HELP custom_records Inbox records by consumer and state (in_progress: two-phase claims with a live lease; stale: in progress under an expired lease; completed: not yet expired), as last sampled.
# TYPE custom_records gauge
custom_records{consumer="payments",state="stale"} 3
`), "custom_janitor_deleted_records_total", "custom_janitor_errors_total", "custom_records"))
}

func TestNoRegistererIsAnError(t *testing.T) {
	_, err := metrics.New(metrics.Config{})
	require.ErrorContains(t, err, "Registerer")

	reg := prometheus.NewRegistry()
	_, err = metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)
	_, err = metrics.New(metrics.Config{Registerer: reg})
	require.Error(t, err, "registering twice on one registry is refused, not silently shared")
}

// counter finds the labelled child of a counter family by gathering, so
// the test reads what a scrape would.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) prometheus.Collector {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, metric := range f.GetMetric() {
			if labelsMatch(metric.GetLabel(), labels) {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x", Help: "x"}, func() float64 { return metric.GetCounter().GetValue() })
			}
		}
	}
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x", Help: "x"}, func() float64 { return 0 })
}

func labelsMatch(got []*dto.LabelPair, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i, l := range got {
		if l.GetValue() != want[i] {
			return false
		}
	}
	return true
}
