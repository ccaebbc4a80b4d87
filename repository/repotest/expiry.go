package repotest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

func runExpiry(t *testing.T, b Backend) {
	t.Run("CleanupDeletesExpiredInBatches", func(t *testing.T) {
		t.Parallel()
		if !b.Features.Transactional && !b.Features.TwoPhase {
			t.Skipf("%s: seeding records needs a claim contract", b.Name)
		}
		f := newFixture(t, b)
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Microsecond)

		const expired, live, batch = 250, 10, 100
		seed := func(key string, expiresAt time.Time) {
			f.seedCompleted(t, "billing", key, expiresAt.Add(-time.Hour), expiresAt)
		}
		for i := range expired {
			seed(fmt.Sprintf("expired-%d", i), now.Add(-time.Duration(i+1)*time.Minute))
		}
		for i := range live {
			seed(fmt.Sprintf("live-%d", i), now.Add(time.Duration(i+1)*time.Minute))
		}

		if b.Features.ExpiryByTTL {
			// The store expired the records by itself; cleanup has nothing
			// left to do.
			n, err := repository.DeleteAllExpired(ctx, f.repo, now, batch)
			require.NoError(t, err)
			require.Zero(t, n, "DeleteExpired of a TTL store deletes nothing")
		} else if iv := b.Features.CleanupInterval; iv > 0 {
			// Whole intervals go, limit or not; the current one stays.
			cut := now.Truncate(iv)
			gone := 0
			for i := range expired {
				if now.Add(-time.Duration(i+1) * time.Minute).Before(cut) {
					gone++
				}
			}
			n, err := f.repo.DeleteExpired(ctx, now, batch)
			require.NoError(t, err)
			require.Equal(t, gone, n, "records expiring before %s", cut)
			n, err = f.repo.DeleteExpired(ctx, now, batch)
			require.NoError(t, err)
			require.Zero(t, n)
			for i := range expired {
				expiresAt := now.Add(-time.Duration(i+1) * time.Minute)
				_, err := f.repo.Get(ctx, "billing", fmt.Sprintf("expired-%d", i))
				if expiresAt.Before(cut) {
					require.ErrorIs(t, err, repository.ErrNotFound, "record expiring at %s", expiresAt)
				} else {
					require.NoError(t, err, "record expiring at %s, in the current interval", expiresAt)
				}
			}
			for i := range live {
				_, err := f.repo.Get(ctx, "billing", fmt.Sprintf("live-%d", i))
				require.NoError(t, err, "live record %d must survive cleanup", i)
			}
			return
		} else {
			n, err := f.repo.DeleteExpired(ctx, now, batch)
			require.NoError(t, err)
			require.Equal(t, batch, n, "one call deletes at most one batch")

			n, err = repository.DeleteAllExpired(ctx, f.repo, now, batch)
			require.NoError(t, err)
			require.Equal(t, expired-batch, n)

			n, err = f.repo.DeleteExpired(ctx, now, batch)
			require.NoError(t, err)
			require.Zero(t, n)
		}

		for i := range expired {
			_, err := f.repo.Get(ctx, "billing", fmt.Sprintf("expired-%d", i))
			require.ErrorIs(t, err, repository.ErrNotFound)
		}
		for i := range live {
			_, err := f.repo.Get(ctx, "billing", fmt.Sprintf("live-%d", i))
			require.NoError(t, err, "live record %d must survive cleanup", i)
		}
	})

	runCase(t, b, "CleanupRefusesNonPositiveLimit", func(t *testing.T, f *fixture) {
		_, err := f.repo.DeleteExpired(t.Context(), time.Now(), 0)
		require.ErrorIs(t, err, repository.ErrInvalidParams)
	})
}
