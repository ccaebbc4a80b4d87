package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// batchCounter observes relay batches only.
type batchCounter struct{ batches int }

func (c *batchCounter) ObserveRelayBatch(context.Context, outbox.RelayBatch) { c.batches++ }

// backlogCounter observes relay batches and backlog samples.
type backlogCounter struct{ batches, backlogs int }

func (c *backlogCounter) ObserveRelayBatch(context.Context, outbox.RelayBatch) { c.batches++ }
func (c *backlogCounter) ObserveBacklog(context.Context, outbox.Backlog)       { c.backlogs++ }

// TestRelayObserversSampleOnlyForBacklogObservers: RelayObservers takes
// backlog samples (so that the relay queries its backlog every
// BacklogInterval) only when one of its observers does, and gives them
// to those alone; batches go to all.
func TestRelayObserversSampleOnlyForBacklogObservers(t *testing.T) {
	plain := &batchCounter{}
	_, ok := outbox.RelayObservers(plain, nil).(outbox.BacklogObserver)
	require.False(t, ok, "no observer takes backlog samples: the relay must not sample for them")

	b := &backlogCounter{}
	both := outbox.RelayObservers(plain, nil, b)
	bo, ok := both.(outbox.BacklogObserver)
	require.True(t, ok)
	_, ok = both.(outbox.RelayBatchStarter)
	require.True(t, ok)
	both.ObserveRelayBatch(t.Context(), outbox.RelayBatch{})
	bo.ObserveBacklog(t.Context(), outbox.Backlog{})
	require.Equal(t, 1, plain.batches)
	require.Equal(t, backlogCounter{batches: 1, backlogs: 1}, *b)
}
