package repotest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository"
)

// runBatch checks repository.Driver's Claim of several params: multi-row
// claims in one transaction, racing batches with overlapping keys.
func runBatch(t *testing.T, b Backend) {
	runCase(t, b, "FreshAndDuplicatesInOrder", func(t *testing.T, f *fixture) {
		f.claim(t, ClaimParams("billing", "k-2"), []byte("stored-2"))
		f.claim(t, ClaimParams("billing", "k-4"), nil)
		long := strings.Repeat("k", 300)
		var params []repository.ClaimParams
		for _, k := range []string{"k-5", "k-2", "k-1", "k-4", long, "k-3"} {
			params = append(params, ClaimParams("billing", k))
		}
		// Same key, another scope: not a duplicate.
		params = append(params, ClaimParams("shipping", "k-2"))
		claims := claimBatch(t, f, params)
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

	runCase(t, b, "RollbackLeavesNothing", func(t *testing.T, f *fixture) {
		tx := f.beginTx(t)
		claims, err := f.batch.Claim(t.Context(), tx, []repository.ClaimParams{ClaimParams("billing", "a"), ClaimParams("billing", "b")})
		require.NoError(t, err)
		require.True(t, claims[0].Claimed && claims[1].Claimed)
		require.NoError(t, tx.Rollback())
		for _, k := range []string{"a", "b"} {
			_, err := f.repo.Get(context.Background(), "billing", k)
			require.ErrorIs(t, err, repository.ErrNotFound)
		}
	})

	runCase(t, b, "RefusesAKeyTwice", func(t *testing.T, f *fixture) {
		tx := f.beginTx(t)
		long := strings.Repeat("x", 300)
		for _, pair := range [][2]string{{"a", "a"}, {long, long}} {
			_, err := f.batch.Claim(context.Background(), tx, []repository.ClaimParams{
				ClaimParams("billing", pair[0]), ClaimParams("billing", "other"), ClaimParams("billing", pair[1])})
			require.ErrorIs(t, err, repository.ErrInvalidParams)
		}
		_, err := f.batch.Claim(context.Background(), tx, []repository.ClaimParams{{Consumer: "billing"}})
		require.ErrorIs(t, err, repository.ErrInvalidParams)
	})

	runCase(t, b, "RacingBatchesClaimEachKeyOnce", func(t *testing.T, f *fixture) {
		const keys, racers = 40, 8
		var (
			won     = make([]atomic.Int32, keys)
			retries atomic.Int32
		)
		failures := race(racers, func(r int) error {
			// Each racer claims its own shuffled half of the keys: the
			// batches overlap in different orders.
			perm := rand.Perm(keys)[:keys/2]
			params := make([]repository.ClaimParams, len(perm))
			for i, k := range perm {
				params[i] = ClaimParams("billing", fmt.Sprintf("key-%02d", k))
			}
			for range 20 {
				claims, err := claimOnce(f, params)
				if f.batch.Retryable(err) {
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
		})
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

// claimBatch claims params in one transaction and commits it.
func claimBatch(t *testing.T, f *fixture, params []repository.ClaimParams) []repository.Claim {
	t.Helper()
	claims, err := claimOnce(f, params)
	require.NoError(t, err)
	return claims
}

// claimOnce claims params in one transaction and commits it.
func claimOnce(f *fixture, params []repository.ClaimParams) (claims []repository.Claim, err error) {
	ctx := context.Background()
	err = inTx(ctx, f.b.DB, func(tx *sql.Tx) error {
		claims, err = f.batch.Claim(ctx, tx, params)
		return err
	})
	return claims, err
}
