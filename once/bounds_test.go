package once_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// TestStoreThatStopsAnsweringHoldsNoCall: a store whose every call hangs
// until its context ends holds Do for at most 3 × StoreTimeout besides
// fn's time — before the claim (fn does not run), after fn succeeded
// (the completion goes on in the background: once the store answers, a
// retry replays fn's output) and after fn failed (the release goes on in
// the background: the retry runs fn).
func TestStoreThatStopsAnsweringHoldsNoCall(t *testing.T) {
	const storeTimeout = 500 * time.Millisecond
	bound := 3 * storeTimeout
	setup := func(t *testing.T) (*backends.Hanging, *once.TwoPhase) {
		repo := &backends.Hanging{TwoPhase: memory.NewRepository()}
		o, err := once.NewTwoPhase(once.TwoPhaseConfig{
			Repository: repo, Scope: "jobs", Lease: 3 * time.Second, StoreTimeout: storeTimeout,
			FinishRetry: idempotency.FinishRetry{MaxAttempts: 50, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		})
		require.NoError(t, err)
		return repo, o
	}
	// do calls o.Do and returns how long it took, failing the test if it
	// has not returned after 10 × bound.
	do := func(t *testing.T, o *once.TwoPhase, fn once.Func) (once.Result, time.Duration, error) {
		type answer struct {
			res once.Result
			err error
		}
		start := time.Now()
		done := make(chan answer, 1)
		go func() {
			res, err := o.Do(context.Background(), "k", fn)
			done <- answer{res, err}
		}()
		select {
		case a := <-done:
			return a.res, time.Since(start), a.err
		case <-time.After(10 * bound):
			t.Fatalf("Do has not returned after %s", 10*bound)
			return once.Result{}, 0, nil
		}
	}
	drain := func(t *testing.T, o *once.TwoPhase) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.NoError(t, o.Drain(ctx))
	}

	t.Run("before the claim", func(t *testing.T) {
		t.Parallel()
		repo, o := setup(t)
		repo.Hang.Store(true)
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) { runs.Add(1); return []byte("done"), nil }
		_, took, err := do(t, o, fn)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, took, bound)
		require.Zero(t, runs.Load())
		repo.Hang.Store(false)
		drain(t, o)
		res, err := o.Do(t.Context(), "k", fn)
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("done")}, res)
	})

	t.Run("after fn succeeded", func(t *testing.T) {
		t.Parallel()
		repo, o := setup(t)
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) {
			runs.Add(1)
			repo.Hang.Store(true)
			return []byte("done"), nil
		}
		_, took, err := do(t, o, fn)
		require.Error(t, err, "the completion is not confirmed")
		require.Less(t, took, bound)
		repo.Hang.Store(false)
		drain(t, o)
		res, err := o.Do(t.Context(), "k", fn)
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("done"), Replayed: true}, res, "completed in the background")
		require.EqualValues(t, 1, runs.Load())
	})

	t.Run("after fn failed", func(t *testing.T) {
		t.Parallel()
		repo, o := setup(t)
		boom := errors.New("boom")
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) {
			if runs.Add(1) == 1 {
				repo.Hang.Store(true)
				return nil, boom
			}
			return []byte("done"), nil
		}
		_, took, err := do(t, o, fn)
		require.ErrorIs(t, err, boom)
		require.Less(t, took, bound)
		repo.Hang.Store(false)
		drain(t, o)
		res, err := o.Do(t.Context(), "k", fn)
		require.NoError(t, err, "released in the background: the retry runs fn")
		require.Equal(t, once.Result{Value: []byte("done")}, res)
	})
}
