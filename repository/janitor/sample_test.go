package janitor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
)

// sample is one sample a SampleObserver received.
type sample struct {
	now    time.Time
	counts []repository.RecordCount
}

// samples records every sample and signals each one: a
// janitor.SampleObserver.
type samples struct {
	mu   sync.Mutex
	all  []sample
	each chan sample
}

func newSamples() *samples { return &samples{each: make(chan sample, 1024)} }

func (s *samples) ObserveJanitorBatch(context.Context, janitor.Batch) {}

func (s *samples) ObserveRecordCounts(_ context.Context, smp janitor.Sample) {
	s.record(smp.Now, smp.Counts)
}

// hooks is an Observer and SampleObserver of two functions.
type hooks struct {
	batch  func(janitor.Batch)
	sample func(janitor.Sample)
}

func (h hooks) ObserveJanitorBatch(_ context.Context, b janitor.Batch)  { h.batch(b) }
func (h hooks) ObserveRecordCounts(_ context.Context, s janitor.Sample) { h.sample(s) }

func (s *samples) record(now time.Time, counts []repository.RecordCount) {
	s.mu.Lock()
	s.all = append(s.all, sample{now, counts})
	s.mu.Unlock()
	select {
	case s.each <- sample{now, counts}:
	default:
	}
}

func (s *samples) taken() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.all...)
}

// next waits for the next sample, failing t after a deadline.
func (s *samples) next(t *testing.T) sample {
	t.Helper()
	select {
	case got := <-s.each:
		return got
	case <-time.After(10 * time.Second):
		t.Fatal("no janitor sample within 10s")
		return sample{}
	}
}

// acquire takes a two-phase lease on consumer/key at now until leaseUntil.
func (in inbox) acquire(t *testing.T, consumer, key string, now, leaseUntil time.Time) {
	t.Helper()
	a, err := in.repo.Acquire(t.Context(), repository.AcquireParams{
		Consumer: consumer, Key: key, PayloadHash: repository.HashPayload([]byte(key)),
		Owner: "owner-" + key, Now: now, LeaseUntil: leaseUntil, ExpiresAt: now.Add(24 * time.Hour),
	})
	require.NoError(t, err)
	require.True(t, a.Acquired)
}

func TestRunOnceSamplesRecordsAfterThePass(t *testing.T) {
	in := newInbox(t)
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	in.seed(t, "billing", "expired", 4, now.Add(-time.Minute))
	in.seed(t, "billing", "done", 3, now.Add(time.Hour))
	in.acquire(t, "billing", "live", now, now.Add(time.Minute))
	in.acquire(t, "billing", "stale", now.Add(-2*time.Minute), now.Add(-time.Minute))
	in.acquire(t, "shipping", "stale", now.Add(-2*time.Minute), now)

	var (
		mu     sync.Mutex
		events []string
	)
	event := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	s := newSamples()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{
		Now: func() time.Time { return now },
		Observer: hooks{
			batch: func(janitor.Batch) { event("batch") },
			sample: func(smp janitor.Sample) {
				event("sample")
				s.record(smp.Now, smp.Counts)
			},
		},
	})
	require.NoError(t, err)
	defer j.Close()

	n, err := j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, []string{"batch", "sample"}, events, "one sample, after the pass")
	require.Equal(t, []sample{{now, []repository.RecordCount{
		{Consumer: "billing", InProgress: 1, Stale: 1, Completed: 3},
		{Consumer: "shipping", Stale: 1},
	}}}, s.taken())
}

func TestRunSamplesEveryPass(t *testing.T) {
	in := newInbox(t)
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clk := newClock(start)
	in.acquire(t, "billing", "order-1", start, start.Add(time.Minute))

	s := newSamples()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{
		Interval: 5 * time.Millisecond,
		Now:      clk.Now,
		Observer: s,
	})
	require.NoError(t, err)

	runErr := make(chan error, 1)
	go func() { runErr <- j.Run(context.Background()) }()

	first := s.next(t)
	require.Equal(t, start, first.now)
	require.Equal(t, []repository.RecordCount{{Consumer: "billing", InProgress: 1}}, first.counts,
		"the first pass samples at once")

	clk.add(time.Minute) // the lease runs out; a later pass sees it
	for {
		got := s.next(t)
		if got.now.Equal(start.Add(time.Minute)) {
			require.Equal(t, []repository.RecordCount{{Consumer: "billing", Stale: 1}}, got.counts)
			break
		}
	}
	require.NoError(t, j.Close())
	require.NoError(t, <-runErr)
}

func TestFailedSampleIsLoggedAndThePassSucceeds(t *testing.T) {
	in := newInbox(t)
	now := time.Now()
	in.seed(t, "billing", "expired", 2, now.Add(-time.Minute))
	// Cleanup does not read lease_until, counting does: with the column
	// renamed every sample fails while deletions go on.
	_, err := in.db.ExecContext(t.Context(), `ALTER TABLE watermill_inbox RENAME COLUMN lease_until TO lease_until_gone`)
	require.NoError(t, err)

	logger := watermill.NewCaptureLogger()
	s := newSamples()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{Observer: s, Logger: logger})
	require.NoError(t, err)
	defer j.Close()

	n, err := j.RunOnce(t.Context())
	require.NoError(t, err, "a failed sample never fails the pass")
	require.Equal(t, 2, n)
	require.Empty(t, s.taken(), "no sample is reported when counting failed")
	errs := logger.Captured()[watermill.ErrorLogLevel]
	require.Len(t, errs, 1)
	require.Equal(t, "Inbox janitor could not sample records", errs[0].Msg)
	require.ErrorContains(t, errs[0].Err, "lease_until")

	_, err = in.db.ExecContext(t.Context(), `ALTER TABLE watermill_inbox RENAME COLUMN lease_until_gone TO lease_until`)
	require.NoError(t, err)
	_, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Len(t, s.taken(), 1, "the next pass samples again")
	require.Empty(t, s.taken()[0].counts)
}

// A SampleObserver over a cleaner that cannot count records gets its
// batches and no sample: one metrics value serves every janitor.
func TestJanitorWithoutStatsTakesNoSamples(t *testing.T) {
	in := newInbox(t)
	cleanerOnly := struct{ repository.Cleaner }{in.repo}
	s := newSamples()
	j, err := janitor.NewJanitor(cleanerOnly, janitor.Config{Observer: s})
	require.NoError(t, err, "a plain Cleaner is enough")
	_, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Empty(t, s.taken(), "no repository.Stats, no sample")
	require.NoError(t, j.Close())
}
