package metrics_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/metrics"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

const recordsHeader = `# HELP watermill_idempotent_records Inbox records by consumer and state (in_progress: two-phase claims with a live lease; stale: in progress under an expired lease; completed: not yet expired), as last sampled.
# TYPE watermill_idempotent_records gauge
`

func requireRecords(t *testing.T, reg prometheus.Gatherer, want string) {
	t.Helper()
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(recordsHeader+want), "watermill_idempotent_records"))
}

func TestObserveRecordCounts(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

	m.ObserveRecordCounts(t.Context(), janitor.Sample{Now: t0, Counts: []repository.RecordCount{
		{Consumer: "billing", InProgress: 1, Stale: 2, Completed: 3},
		{Consumer: "shipping", Stale: 1},
	}})
	requireRecords(t, reg, `
watermill_idempotent_records{consumer="billing",state="completed"} 3
watermill_idempotent_records{consumer="billing",state="in_progress"} 1
watermill_idempotent_records{consumer="billing",state="stale"} 2
watermill_idempotent_records{consumer="shipping",state="completed"} 0
watermill_idempotent_records{consumer="shipping",state="in_progress"} 0
watermill_idempotent_records{consumer="shipping",state="stale"} 1
`)

	// shipping's records are gone: its stale gauge must not stick at 1.
	t1 := t0.Add(time.Minute)
	m.ObserveRecordCounts(t.Context(), janitor.Sample{Now: t1, Counts: []repository.RecordCount{{Consumer: "billing", Completed: 4}}})
	after := `
watermill_idempotent_records{consumer="billing",state="completed"} 4
watermill_idempotent_records{consumer="billing",state="in_progress"} 0
watermill_idempotent_records{consumer="billing",state="stale"} 0
watermill_idempotent_records{consumer="shipping",state="completed"} 0
watermill_idempotent_records{consumer="shipping",state="in_progress"} 0
watermill_idempotent_records{consumer="shipping",state="stale"} 0
`
	requireRecords(t, reg, after)

	m.ObserveRecordCounts(t.Context(), janitor.Sample{Now: t0, Counts: []repository.RecordCount{{Consumer: "shipping", Stale: 9}}})
	requireRecords(t, reg, after) // an older sample arriving late is ignored

	m.ObserveRecordCounts(t.Context(), janitor.Sample{Now: t1.Add(time.Minute), Counts: nil})
	requireRecords(t, reg, `
watermill_idempotent_records{consumer="billing",state="completed"} 0
watermill_idempotent_records{consumer="billing",state="in_progress"} 0
watermill_idempotent_records{consumer="billing",state="stale"} 0
watermill_idempotent_records{consumer="shipping",state="completed"} 0
watermill_idempotent_records{consumer="shipping",state="in_progress"} 0
watermill_idempotent_records{consumer="shipping",state="stale"} 0
`)
}

// TestJanitorSamplesRecordGauges wires the gauges the documented way, to a
// janitor over a real SQLite inbox, and checks what a scrape would read.
func TestJanitorSamplesRecordGauges(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	require.NoError(t, err)

	db, err := sqlite.Open(filepath.Join(t.TempDir(), "m.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))

	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	acquire := func(consumer, key string, lease, expires time.Duration) {
		a, err := repo.Acquire(t.Context(), repository.AcquireParams{
			Consumer: consumer, Key: key, PayloadHash: repository.HashPayload([]byte(key)), Owner: "owner-" + key,
			Now: now.Add(-time.Hour), LeaseUntil: now.Add(lease), ExpiresAt: now.Add(expires),
		})
		require.NoError(t, err)
		require.True(t, a.Acquired)
	}
	acquire("payments", "charging", time.Minute, 24*time.Hour)
	acquire("payments", "crashed-1", -time.Minute, 24*time.Hour)
	acquire("payments", "crashed-2", 0, 24*time.Hour)
	acquire("payments", "charged", time.Minute, 24*time.Hour)
	require.NoError(t, repo.Complete(t.Context(), repository.CompleteParams{Consumer: "payments", Key: "charged", Owner: "owner-charged", Now: now}))
	acquire("payments", "expired", -time.Minute, -time.Second) // the pass deletes it
	acquire("mailer", "crashed", -time.Minute, 24*time.Hour)

	j, err := janitor.NewJanitor(repo, janitor.Config{
		Now:      func() time.Time { return now },
		Observer: m,
	})
	require.NoError(t, err)
	defer j.Close()
	n, err := j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	requireRecords(t, reg, `
watermill_idempotent_records{consumer="mailer",state="completed"} 0
watermill_idempotent_records{consumer="mailer",state="in_progress"} 0
watermill_idempotent_records{consumer="mailer",state="stale"} 1
watermill_idempotent_records{consumer="payments",state="completed"} 1
watermill_idempotent_records{consumer="payments",state="in_progress"} 1
watermill_idempotent_records{consumer="payments",state="stale"} 2
`)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP watermill_idempotent_janitor_deleted_records_total Expired inbox records deleted by the janitor.
# TYPE watermill_idempotent_janitor_deleted_records_total counter
watermill_idempotent_janitor_deleted_records_total 1
`), "watermill_idempotent_janitor_deleted_records_total"))
}
