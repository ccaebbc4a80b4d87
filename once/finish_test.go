package once_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository"
)

// doUntilSettled calls o.Do as a patient client does: again while another
// call holds the key (idempotency.ErrInProgress), until a deadline.
func doUntilSettled(t *testing.T, o *once.TwoPhase, key string, fn once.Func) (once.Result, error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := o.Do(t.Context(), key, fn)
		if !errors.Is(err, idempotency.ErrInProgress) || time.Now().After(deadline) {
			return res, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTwoPhaseCompleteFailingOnce: one dropped connection under Complete,
// after the effect, must neither run the effect twice (Reclaim) nor strand
// an applied call for an operator (Intervene): Complete is retried while
// the lease is held, and a Complete that committed with its answer lost
// is recognised as this call's own.
func TestTwoPhaseCompleteFailingOnce(t *testing.T) {
	for _, policy := range []idempotency.ExpiredLeasePolicy{idempotency.Intervene, idempotency.Reclaim} {
		for _, lostAnswer := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/lost-answer=%t", policy, lostAnswer), func(t *testing.T) {
				t.Parallel()
				backends.ForEach(t, nil, func(t *testing.T, s *backends.Store) {
					repo := &backends.Faulty{TwoPhase: s.Repo, CommitFirst: lostAnswer}
					repo.FailComplete.Store(1)
					o, err := once.NewTwoPhase(once.TwoPhaseConfig{
						Repository: repo, Scope: backends.RandomName("pay"),
						Lease: 5 * time.Second, OnExpiredLease: policy,
					})
					require.NoError(t, err)
					var charges atomic.Int32
					charge := func(context.Context) ([]byte, error) {
						return fmt.Appendf(nil, "charge-%d", charges.Add(1)), nil
					}

					first, firstErr := o.Do(t.Context(), "order-1", charge)
					// The caller retries as it would after an error, and
					// repeats as it would anyway.
					again, err := doUntilSettled(t, o, "order-1", charge)
					require.EqualValues(t, 1, charges.Load(), "the effect ran exactly once")
					require.NoError(t, err, "the repeat replays")
					require.Equal(t, once.Result{Value: []byte("charge-1"), Replayed: true}, again)
					require.NoError(t, firstErr, "one failed Complete is retried")
					require.Equal(t, once.Result{Value: []byte("charge-1")}, first)
					// A retry; unless the first committed: the lease extension
					// before the retry then finds the record completed, by this call.
					wantCompletes := 2
					if lostAnswer {
						wantCompletes = 1
					}
					require.EqualValues(t, wantCompletes, repo.Completes.Load())
				})
			})
		}
	}
}

// TestTwoPhaseHungExtensionDoesNotHoldDo: an extension hanging when the
// function returns is abandoned; Do returns within StoreTimeout of the
// function's end, not when the store finally answers.
func TestTwoPhaseHungExtensionDoesNotHoldDo(t *testing.T) {
	backends.ForEach(t, []string{"memory", "postgres"}, func(t *testing.T, s *backends.Store) {
		const (
			lease        = 3 * time.Second
			storeTimeout = lease / 3 // the default
			hang         = 30 * time.Second
		)
		repo := &backends.Faulty{TwoPhase: s.Repo, ExtendHang: hang}
		o, err := once.NewTwoPhase(once.TwoPhaseConfig{
			Repository: repo, Scope: backends.RandomName("job"),
			Lease: lease, ExtendEvery: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		var fnEnd time.Time
		res, err := o.Do(t.Context(), "k", func(context.Context) ([]byte, error) {
			// Return while an extension hangs, or this test proves nothing.
			deadline := time.Now().Add(30 * time.Second)
			for repo.ExtendsStarted.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			fnEnd = time.Now()
			return []byte("done"), nil
		})
		returned := time.Since(fnEnd)
		t.Logf("%s: Do returned %s after the function, with an extension hanging %s", s.Name, returned.Round(time.Millisecond), hang)
		require.NoError(t, err)
		require.Equal(t, []byte("done"), res.Value)
		require.Positive(t, repo.ExtendsStarted.Load(), "an extension must have hung")
		// Generous for a loaded machine, far below the hang.
		require.Less(t, returned, 10*storeTimeout, "Do waited for the hung extension")
	})
}

// TestTwoPhaseCompleteRetriesAreBounded: a store that keeps failing ends
// the call with its error after FinishRetry.MaxAttempts, leaving the key
// in progress (the effect happened: neither completed nor released).
func TestTwoPhaseCompleteRetriesAreBounded(t *testing.T) {
	backends.ForEach(t, []string{"memory"}, func(t *testing.T, s *backends.Store) {
		repo := &backends.Faulty{TwoPhase: s.Repo}
		repo.FailComplete.Store(100)
		scope := backends.RandomName("pay")
		o, err := once.NewTwoPhase(once.TwoPhaseConfig{
			Repository: repo, Scope: scope,
			FinishRetry: idempotency.FinishRetry{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
		})
		require.NoError(t, err)
		_, err = o.Do(t.Context(), "k", func(context.Context) ([]byte, error) { return []byte("v"), nil })
		require.ErrorIs(t, err, backends.ErrConnReset)
		require.EqualValues(t, 3, repo.Completes.Load())
		rec, err := s.Repo.Get(t.Context(), scope, "k")
		require.NoError(t, err)
		require.Equal(t, repository.StateInProgress, rec.State)
	})
}

func TestTwoPhaseStoreConfig(t *testing.T) {
	backends.ForEach(t, []string{"memory"}, func(t *testing.T, s *backends.Store) {
		for name, cfg := range map[string]once.TwoPhaseConfig{
			"store timeout not below lease": {Lease: time.Second, StoreTimeout: time.Second},
			"negative store timeout":        {StoreTimeout: -time.Second},
			"negative attempts":             {FinishRetry: idempotency.FinishRetry{MaxAttempts: -1}},
			"max interval below initial":    {FinishRetry: idempotency.FinishRetry{InitialInterval: time.Second, MaxInterval: time.Millisecond}},
		} {
			cfg.Repository, cfg.Scope = s.Repo, "job"
			_, err := once.NewTwoPhase(cfg)
			require.Error(t, err, name)
			require.Regexp(t, "config.(StoreTimeout|FinishRetry)", err.Error(), name)
		}
	})
}
