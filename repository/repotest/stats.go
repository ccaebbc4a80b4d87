package repotest

import (
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

func runStats(t *testing.T, b Backend) {
	require.True(t, b.Features.TwoPhase, "%s: Features.Stats requires Features.TwoPhase", b.Name)

	runCase(t, b, "CountsLiveRecordsByConsumerAndState", func(t *testing.T, f *fixture) {
		now := time.Now().UTC().Truncate(time.Microsecond)
		at := now.Add(5 * time.Minute) // the sample's time
		day := 24 * time.Hour
		acquire := func(consumer, key string, lease, expires time.Duration) {
			p := acquireParams(consumer, key, "owner-"+key)
			p.Now, p.LeaseUntil, p.ExpiresAt = now, now.Add(lease), now.Add(expires)
			require.True(t, f.acquire(t, p).Acquired)
		}

		// billing: 3 completed, 2 live, 3 stale, and 3 expired at the sample.
		f.seedCompleted(t, "billing", "done-1", now, now.Add(day)) // through Claim where the backend has it
		f.seedCompleted(t, "billing", "done-2", now, now.Add(day))
		acquire("billing", "done-3", time.Minute, day)
		require.NoError(t, f.tp.Complete(t.Context(), repository.CompleteParams{Consumer: "billing", Key: "done-3", Owner: "owner-done-3", Now: now}))
		acquire("billing", "live-1", time.Hour, day)
		acquire("billing", "live-2", 5*time.Minute+time.Microsecond, day)
		acquire("billing", "stale-1", time.Minute, day)
		acquire("billing", "stale-2", 2*time.Minute, day)
		acquire("billing", "stale-3", 5*time.Minute, day) // a lease is stale from its deadline on
		acquire("billing", "expired-1", time.Minute, 3*time.Minute)
		acquire("billing", "expired-2", time.Minute, 5*time.Minute) // expired from its ExpiresAt on
		f.seedCompleted(t, "billing", "expired-3", now, now.Add(4*time.Minute))
		// Consumers that a naive prefix or glob match would confuse.
		acquire("billing:eu", "live-1", time.Hour, day)
		acquire("bill*", "stale-1", time.Minute, day)
		// shipping: 1 stale, 1 completed; gone: nothing left at the sample.
		acquire("shipping", "stale-1", time.Minute, day)
		f.seedCompleted(t, "shipping", "done-1", now, now.Add(day))
		acquire("gone", "expired-1", time.Minute, 2*time.Minute)

		require.Equal(t, []repository.RecordCount{
			{Consumer: "bill*", Stale: 1},
			{Consumer: "billing", InProgress: 2, Stale: 3, Completed: 3},
			{Consumer: "billing:eu", InProgress: 1},
			{Consumer: "shipping", Stale: 1, Completed: 1},
		}, f.countRecords(t, at), "sorted by consumer; records expired at the sample are not counted")

		require.Equal(t, []repository.RecordCount{
			{Consumer: "bill*", InProgress: 1},
			{Consumer: "billing", InProgress: 7, Completed: 4},
			{Consumer: "billing:eu", InProgress: 1},
			{Consumer: "gone", InProgress: 1},
			{Consumer: "shipping", InProgress: 1, Completed: 1},
		}, f.countRecords(t, now), "at the acquire's time every lease is live and nothing has expired")
	})

	runCase(t, b, "CountsFollowStateChanges", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		f.acquired(t, "billing", "order-2", "owner-a")
		at := p.LeaseUntil.Add(time.Minute)
		require.Equal(t, []repository.RecordCount{{Consumer: "billing", Stale: 2}}, f.countRecords(t, at))

		_, err := f.tp.Reclaim(ctx, repository.ReclaimParams{
			Consumer: "billing", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-b", Now: at, LeaseUntil: at.Add(leaseLength),
		})
		require.NoError(t, err)
		require.Equal(t, []repository.RecordCount{{Consumer: "billing", InProgress: 1, Stale: 1}}, f.countRecords(t, at),
			"a reclaimed record is live again")

		require.NoError(t, f.tp.Complete(ctx, repository.CompleteParams{Consumer: "billing", Key: "order-1", Owner: "owner-b", Now: at}))
		require.NoError(t, f.tp.Release(ctx, repository.LeaseParams{Consumer: "billing", Key: "order-2", Owner: "owner-a"}))
		require.Equal(t, []repository.RecordCount{{Consumer: "billing", Completed: 1}}, f.countRecords(t, at),
			"completed counts once, a released record not at all")
	})

	runCase(t, b, "EmptyStoreHasNoCounts", func(t *testing.T, f *fixture) {
		require.Empty(t, f.countRecords(t, time.Now()))
	})

	runCase(t, b, "ZeroNowIsRefused", func(t *testing.T, f *fixture) {
		_, err := f.st.CountRecords(t.Context(), time.Time{})
		require.ErrorIs(t, err, repository.ErrInvalidParams)
	})
}

// countRecords counts the records live at now and requires no error.
func (f *fixture) countRecords(t *testing.T, now time.Time) []repository.RecordCount {
	t.Helper()
	counts, err := f.st.CountRecords(t.Context(), now)
	require.NoError(t, err)
	return counts
}
