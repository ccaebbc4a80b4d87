package once_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/backends"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository"
)

// TestTwoPhaseCompleteRetriesAreBounded: a store that keeps failing ends
// the call with its error after FinishRetry.MaxAttempts, leaving the key
// in progress (the effect happened: neither completed nor released).
func TestTwoPhaseCompleteRetriesAreBounded(t *testing.T) {
	backends.ForEach(t, []string{"memory"}, func(t *testing.T, s *backends.Store) {
		repo := &backends.Faulty{TwoPhase: s.Repo}
		repo.FailComplete.Store(100)
		scope := backends.RandomName("pay")
		o, err := once.NewTwoPhase(once.Config{
			Repository: repo, Scope: scope,
			FinishRetry: middleware.FinishRetry{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
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
		for name, cfg := range map[string]once.Config{
			"store timeout not below lease": {Lease: time.Second, StoreTimeout: time.Second},
			"negative store timeout":        {StoreTimeout: -time.Second},
			"negative attempts":             {FinishRetry: middleware.FinishRetry{MaxAttempts: -1}},
			"max interval below initial":    {FinishRetry: middleware.FinishRetry{InitialInterval: time.Second, MaxInterval: time.Millisecond}},
		} {
			cfg.Repository, cfg.Scope = s.Repo, "job"
			_, err := once.NewTwoPhase(cfg)
			require.Error(t, err, name)
			require.Regexp(t, "config.(StoreTimeout|FinishRetry)", err.Error(), name)
		}
	})
}
