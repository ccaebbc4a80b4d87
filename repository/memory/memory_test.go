package memory_test

import (
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
	"github.com/stretchr/testify/require"
)

func TestConformance(t *testing.T) {
	repotest.Run(t, repotest.Backend{
		Name:     "memory",
		Features: repotest.Features{TwoPhase: true, NoSQLTable: true, Operator: true, Stats: true},
		New: func(*testing.T, string) (repotest.Repository, error) {
			return memory.NewRepository(), nil
		},
	})
}

func TestStoredBytesAreCopies(t *testing.T) {
	ctx := t.Context()
	repo := memory.NewRepository()
	now := time.Now()
	hash := []byte("hash")
	_, err := repo.Acquire(ctx, repository.AcquireParams{
		Consumer: "c", Key: "k", PayloadHash: hash, Owner: "o",
		Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
	})
	require.NoError(t, err)
	result := []byte("result")
	require.NoError(t, repo.Complete(ctx, repository.CompleteParams{Consumer: "c", Key: "k", Owner: "o", Result: result, Now: now}))
	hash[0], result[0] = 'X', 'X'

	rec, err := repo.Get(ctx, "c", "k")
	require.NoError(t, err)
	require.Equal(t, []byte("hash"), rec.PayloadHash, "the caller's slice must not alias the store")
	require.Equal(t, []byte("result"), rec.Result)
	rec.Result[0] = 'Y'
	again, err := repo.Get(ctx, "c", "k")
	require.NoError(t, err)
	require.Equal(t, []byte("result"), again.Result, "a returned slice must not alias the store")
}

func TestAcquireReplacesExpiredRecord(t *testing.T) {
	ctx := t.Context()
	repo := memory.NewRepository()
	now := time.Now()
	params := func(owner string, now time.Time) repository.AcquireParams {
		return repository.AcquireParams{
			Consumer: "c", Key: "k", Owner: owner,
			Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
		}
	}
	a, err := repo.Acquire(ctx, params("first", now))
	require.NoError(t, err)
	require.True(t, a.Acquired)
	require.NoError(t, repo.Complete(ctx, repository.CompleteParams{Consumer: "c", Key: "k", Owner: "first", Now: now}))

	a, err = repo.Acquire(ctx, params("second", now.Add(time.Hour)))
	require.NoError(t, err)
	require.True(t, a.Acquired, "a record past its ExpiresAt is treated as absent")
	rec, err := repo.Get(ctx, "c", "k")
	require.NoError(t, err)
	require.Equal(t, "second", rec.LeaseOwner)
	require.Equal(t, repository.StateInProgress, rec.State)
}

func BenchmarkRepository(b *testing.B) {
	repotest.Bench(b, repotest.BenchBackend{
		Name:     "memory",
		Features: repotest.Features{TwoPhase: true, NoSQLTable: true},
		New: func(testing.TB, string) (repotest.Repository, error) {
			return memory.NewRepository(), nil
		},
	})
}
