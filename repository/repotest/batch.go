package repotest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository"
)

// runBatch checks repository.BatchTransactional: multi-row claims in one
// transaction, racing batches with overlapping keys.
func runBatch(t *testing.T, b Backend) {
	fixture := func(t *testing.T) (*fixture, repository.BatchTransactional) {
		f := newFixture(t, b)
		br, ok := f.repo.(repository.BatchTransactional)
		require.True(t, ok, "%s declares Features.Batch but %T does not implement repository.BatchTransactional", b.Name, f.repo)
		return f, br
	}
	// claimBatch claims params in one transaction and commits it, or
	// rolls it back when commit is false.
	claimBatch := func(t *testing.T, br repository.BatchTransactional, params []repository.ClaimParams, commit bool) []repository.Claim {
		t.Helper()
		ctx := context.Background()
		tx, err := b.DB.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		claims, err := br.ClaimBatchTx(ctx, tx, params)
		require.NoError(t, err)
		if commit {
			require.NoError(t, tx.Commit())
		}
		return claims
	}

	t.Run("FreshAndDuplicatesInOrder", func(t *testing.T) {
		t.Parallel()
		f, br := fixture(t)
		f.claim(t, ClaimParams("billing", "k-2"), []byte("stored-2"))
		f.claim(t, ClaimParams("billing", "k-4"), nil)
		long := strings.Repeat("k", 300)
		var params []repository.ClaimParams
		for _, k := range []string{"k-5", "k-2", "k-1", "k-4", long, "k-3"} {
			params = append(params, ClaimParams("billing", k))
		}
		// Same key, another scope: not a duplicate.
		params = append(params, ClaimParams("shipping", "k-2"))
		claims := claimBatch(t, br, params, true)
		require.Len(t, claims, len(params))
		for i, p := range params {
			dup := p.Consumer == "billing" && (p.Key == "k-2" || p.Key == "k-4")
			require.Equal(t, !dup, claims[i].Claimed, "claim %d (%s/%s)", i, p.Consumer, p.Key)
			if dup {
				require.Equal(t, repository.HashPayload([]byte(p.Key)), claims[i].Existing.PayloadHash)
				require.Equal(t, repository.StateCompleted, claims[i].Existing.State)
			}
			rec, err := f.repo.Get(context.Background(), p.Consumer, p.Key)
			require.NoError(t, err)
			require.Equal(t, repository.StateCompleted, rec.State)
			requireStoredForm(t, p.Key, rec.Key)
		}
		require.Equal(t, []byte("stored-2"), claims[1].Existing.Result)
	})

	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		t.Parallel()
		f, br := fixture(t)
		claims := claimBatch(t, br, []repository.ClaimParams{ClaimParams("billing", "a"), ClaimParams("billing", "b")}, false)
		require.True(t, claims[0].Claimed && claims[1].Claimed)
		for _, k := range []string{"a", "b"} {
			_, err := f.repo.Get(context.Background(), "billing", k)
			require.ErrorIs(t, err, repository.ErrNotFound)
		}
	})

	t.Run("RefusesAKeyTwice", func(t *testing.T) {
		t.Parallel()
		_, br := fixture(t)
		tx, err := b.DB.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		long := strings.Repeat("x", 300)
		for _, pair := range [][2]string{{"a", "a"}, {long, long}} {
			_, err = br.ClaimBatchTx(context.Background(), tx, []repository.ClaimParams{
				ClaimParams("billing", pair[0]), ClaimParams("billing", "other"), ClaimParams("billing", pair[1])})
			require.ErrorIs(t, err, repository.ErrInvalidParams)
		}
		_, err = br.ClaimBatchTx(context.Background(), tx, []repository.ClaimParams{{Consumer: "billing"}})
		require.ErrorIs(t, err, repository.ErrInvalidParams)
	})

	t.Run("RacingBatchesClaimEachKeyOnce", func(t *testing.T) {
		t.Parallel()
		f, br := fixture(t)
		const keys, racers = 40, 8
		var (
			wg       sync.WaitGroup
			won      = make([]atomic.Int32, keys)
			failures = make([]error, racers)
			retries  atomic.Int32
		)
		for r := range racers {
			wg.Go(func() {
				// Each racer claims its own shuffled half of the keys: the
				// batches overlap in different orders.
				perm := rand.Perm(keys)[:keys/2]
				params := make([]repository.ClaimParams, len(perm))
				for i, k := range perm {
					params[i] = ClaimParams("billing", fmt.Sprintf("key-%02d", k))
				}
				failures[r] = func() error {
					for range 20 {
						claims, err := claimOnce(b, br, params)
						if br.RetryableTx(err) {
							retries.Add(1)
							continue
						}
						if err != nil {
							return err
						}
						for i, c := range claims {
							if c.Claimed {
								won[perm[i]].Add(1)
							}
						}
						return nil
					}
					return fmt.Errorf("racer %d: still failing after 20 attempts", r)
				}()
			})
		}
		wg.Wait()
		for _, err := range failures {
			require.NoError(t, err)
		}
		for k := range keys {
			if won[k].Load() == 0 {
				// No racer's half held it.
				_, err := f.repo.Get(context.Background(), "billing", fmt.Sprintf("key-%02d", k))
				require.ErrorIs(t, err, repository.ErrNotFound)
				continue
			}
			require.EqualValues(t, 1, won[k].Load(), "key %d claimed once", k)
		}
		t.Logf("%s: %d deadlock retries", b.Name, retries.Load())
	})
}

// claimOnce claims params in one transaction and commits it.
func claimOnce(b Backend, br repository.BatchTransactional, params []repository.ClaimParams) ([]repository.Claim, error) {
	ctx := context.Background()
	tx, err := b.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	claims, err := br.ClaimBatchTx(ctx, tx, params)
	if err != nil {
		return nil, err
	}
	return claims, tx.Commit()
}
