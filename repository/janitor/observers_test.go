package janitor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository/janitor"
)

// sampler takes batches and samples.
type sampler struct {
	batches, samples int
}

func (s *sampler) ObserveJanitorBatch(context.Context, janitor.Batch)                     { s.batches++ }
func (s *sampler) ObserveRecordCounts(context.Context, janitor.Sample)                    { s.samples++ }
func (s *sampler) StartJanitorBatch(ctx context.Context, _ janitor.Batch) context.Context { return ctx }

// TestObserversSampleOnlyForSamplers: Observers takes samples (so that
// the janitor counts records after every pass) only when one of its
// observers does, and gives them to those alone; batches go to all.
func TestObserversSampleOnlyForSamplers(t *testing.T) {
	batches := 0
	plain := janitor.ObserverFunc(func(context.Context, janitor.Batch) { batches++ })

	_, ok := janitor.Observers(plain, nil).(janitor.SampleObserver)
	require.False(t, ok, "no observer takes samples: the janitor must not count records for them")

	s := &sampler{}
	both := janitor.Observers(plain, nil, s)
	so, ok := both.(janitor.SampleObserver)
	require.True(t, ok)
	_, ok = both.(janitor.BatchStarter)
	require.True(t, ok)
	both.ObserveJanitorBatch(t.Context(), janitor.Batch{})
	so.ObserveRecordCounts(t.Context(), janitor.Sample{})
	require.Equal(t, 1, batches)
	require.Equal(t, sampler{batches: 1, samples: 1}, *s)
}
