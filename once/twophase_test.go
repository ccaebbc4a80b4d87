package once_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository"
)

func newTwoPhase(t *testing.T, s *backends.Store, cfg once.TwoPhaseConfig) *once.TwoPhase {
	t.Helper()
	cfg.Repository = s.Repo
	if cfg.Scope == "" {
		cfg.Scope = backends.RandomName("job")
	}
	o, err := once.NewTwoPhase(cfg)
	require.NoError(t, err)
	return o
}

func TestTwoPhaseRunsOnceAndReplays(t *testing.T) {
	backends.ForEach(t, nil, func(t *testing.T, s *backends.Store) {
		o := newTwoPhase(t, s, once.TwoPhaseConfig{})
		runs := 0
		fn := func(ctx context.Context) ([]byte, error) {
			runs++
			key, ok := once.KeyFromContext(ctx)
			require.True(t, ok)
			return []byte("done:" + key), nil
		}
		res, err := o.DoInput(t.Context(), "k1", []byte("input"), fn)
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("done:k1")}, res)

		res, err = o.DoInput(t.Context(), "k1", []byte("input"), fn)
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("done:k1"), Replayed: true}, res)
		require.Equal(t, 1, runs)

		_, err = o.DoInput(t.Context(), "k1", []byte("other input"), fn)
		require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)
		require.True(t, idempotency.IsPermanent(err))
		require.Equal(t, 1, runs)

		_, err = o.Do(t.Context(), "", fn)
		require.ErrorIs(t, err, idempotency.ErrNoKey)
	})
}

func TestTwoPhaseFailureReleases(t *testing.T) {
	backends.ForEach(t, nil, func(t *testing.T, s *backends.Store) {
		o := newTwoPhase(t, s, once.TwoPhaseConfig{})
		boom := errors.New("boom")
		_, err := o.Do(t.Context(), "k", func(context.Context) ([]byte, error) { return nil, boom })
		require.ErrorIs(t, err, boom)

		require.PanicsWithValue(t, "kaput", func() {
			_, _ = o.Do(t.Context(), "k", func(context.Context) ([]byte, error) { panic("kaput") })
		})

		res, err := o.Do(t.Context(), "k", func(context.Context) ([]byte, error) { return []byte("third time"), nil })
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("third time")}, res)
	})
}

func TestTwoPhaseConcurrentCallsRunOnce(t *testing.T) {
	backends.ForEach(t, nil, func(t *testing.T, s *backends.Store) {
		o := newTwoPhase(t, s, once.TwoPhaseConfig{})
		const callers = 32
		var runs atomic.Int32
		release := make(chan struct{})
		var wg sync.WaitGroup
		results := make([]once.Result, callers)
		errs := make([]error, callers)
		start := make(chan struct{})
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i], errs[i] = o.Do(context.Background(), "shared", func(context.Context) ([]byte, error) {
					runs.Add(1)
					<-release // hold the lease while the others arrive
					return []byte("v"), nil
				})
			}()
		}
		close(start)
		// The others fail fast with ErrInProgress; then let the winner finish.
		require.Eventually(t, func() bool { return runs.Load() == 1 }, 30*time.Second, time.Millisecond)
		close(release)
		wg.Wait()
		require.EqualValues(t, 1, runs.Load())
		ran := 0
		for i := range callers {
			if errs[i] != nil {
				var busy *once.BusyError
				require.ErrorAs(t, errs[i], &busy)
				require.ErrorIs(t, errs[i], idempotency.ErrInProgress)
				require.False(t, idempotency.IsPermanent(errs[i]))
				continue
			}
			require.Equal(t, []byte("v"), results[i].Value)
			if !results[i].Replayed {
				ran++
			}
		}
		require.Equal(t, 1, ran)
		res, err := o.Do(t.Context(), "shared", func(context.Context) ([]byte, error) { t.Error("ran again"); return nil, nil })
		require.NoError(t, err)
		require.True(t, res.Replayed)
	})
}

// crashedAttempt leaves key in progress under a lease that expired a
// minute ago, as an attempt that died mid-call does.
func crashedAttempt(t *testing.T, s *backends.Store, scope, key string) {
	now := time.Now()
	acq, err := s.Repo.Acquire(t.Context(), repository.AcquireParams{
		Consumer: scope, Key: key, PayloadHash: repository.HashPayload(nil), Owner: "crashed",
		Now: now.Add(-2 * time.Minute), LeaseUntil: now.Add(-time.Minute), ExpiresAt: now.Add(time.Hour),
	})
	require.NoError(t, err)
	require.True(t, acq.Acquired)
}

func TestTwoPhaseExpiredLease(t *testing.T) {
	backends.ForEach(t, nil, func(t *testing.T, s *backends.Store) {
		scope := backends.RandomName("job")
		intervene := newTwoPhase(t, s, once.TwoPhaseConfig{Scope: scope})
		reclaim := newTwoPhase(t, s, once.TwoPhaseConfig{Scope: scope, OnExpiredLease: idempotency.Reclaim})
		crashedAttempt(t, s, scope, "a")
		crashedAttempt(t, s, scope, "b")

		_, err := intervene.Do(t.Context(), "a", func(context.Context) ([]byte, error) { t.Error("ran"); return nil, nil })
		require.ErrorIs(t, err, idempotency.ErrNeedsIntervention)
		require.True(t, idempotency.IsPermanent(err))
		rec, err := s.Repo.Get(t.Context(), scope, "a")
		require.NoError(t, err)
		require.Equal(t, repository.StateInProgress, rec.State, "the record stays for an operator")

		res, err := reclaim.Do(t.Context(), "b", func(context.Context) ([]byte, error) { return []byte("again"), nil })
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("again")}, res)
		rec, err = s.Repo.Get(t.Context(), scope, "b")
		require.NoError(t, err)
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Equal(t, 2, rec.Attempts)
	})
}

func TestTwoPhaseLeaseIsExtended(t *testing.T) {
	backends.ForEach(t, nil, func(t *testing.T, s *backends.Store) {
		scope := backends.RandomName("job")
		const lease = 300 * time.Millisecond
		o := newTwoPhase(t, s, once.TwoPhaseConfig{Scope: scope, Lease: lease, ExtendEvery: 50 * time.Millisecond})
		other := newTwoPhase(t, s, once.TwoPhaseConfig{Scope: scope, Lease: lease, OnExpiredLease: idempotency.Reclaim})
		entered := make(chan struct{})
		finish := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := o.Do(context.Background(), "long", func(ctx context.Context) ([]byte, error) {
				close(entered)
				<-finish
				return []byte("ok"), ctx.Err()
			})
			done <- err
		}()
		<-entered
		first, err := s.Repo.Get(t.Context(), scope, "long")
		require.NoError(t, err)
		// Wait until the first lease deadline is more than a whole lease
		// behind us — unextended, the lease would be long expired — and
		// the stored deadline is still ahead: the lease was extended.
		// The condition runs on another goroutine, where require cannot
		// stop the test: an error ends the wait and is checked after it.
		var rec repository.Record
		var getErr error
		require.Eventually(t, func() bool {
			rec, getErr = s.Repo.Get(t.Context(), scope, "long")
			return getErr != nil || (time.Now().After(first.LeaseUntil.Add(lease)) && rec.LeaseUntil.After(time.Now()))
		}, 10*time.Second, 10*time.Millisecond, "the lease was not extended past its first deadline (%s)", first.LeaseUntil)
		require.NoError(t, getErr)
		require.True(t, rec.LeaseUntil.After(first.LeaseUntil.Add(lease)), "extended deadline %s", rec.LeaseUntil)
		require.Equal(t, first.LeaseOwner, rec.LeaseOwner, "extended by the running call, not taken over")
		_, err = other.Do(t.Context(), "long", func(context.Context) ([]byte, error) { t.Error("reclaimed a live call"); return nil, nil })
		require.ErrorIs(t, err, idempotency.ErrInProgress, "the running call's lease must still be live")
		close(finish)
		require.NoError(t, <-done)
		res, err := other.Do(t.Context(), "long", func(context.Context) ([]byte, error) { t.Error("ran again"); return nil, nil })
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("ok"), Replayed: true}, res)
	})
}
