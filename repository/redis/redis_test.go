package redis_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

func TestConformance(t *testing.T) { runConformance(t, "redis", testenv.Redis(t), redis.Config{}) }

// runConformance runs the conformance suite on client (one server or a
// cluster) with config, under a key prefix per case.
func runConformance(t *testing.T, name string, client goredis.UniversalClient, config redis.Config) {
	repotest.Run(t, repotest.Backend{
		Name:     name,
		Features: repotest.Features{TwoPhase: true, NoSQLTable: true, ExpiryByTTL: true, Operator: true, Stats: true},
		New: func(t *testing.T, table string) (repotest.Repository, error) {
			// The suite's random table name namespaces the case's keys.
			prefix := "watermill-idempotent-test:" + table + ":"
			testenv.DeleteRedisKeysOnCleanup(t, client, prefix)
			c := config // the cases run in parallel: each sets its own prefix
			c.KeyPrefix = prefix
			return redis.NewRepository(client, c)
		},
	})
}

func TestRecordExpiresByTTL(t *testing.T) {
	t.Parallel()
	client, repo := newRepository(t)
	ctx := t.Context()

	now := time.Now()
	a, err := repo.Acquire(ctx, repository.AcquireParams{
		Consumer: "billing", Key: "order-1", Owner: "owner-a",
		Now: now, LeaseUntil: now.Add(100 * time.Millisecond), ExpiresAt: now.Add(500 * time.Millisecond),
	})
	require.NoError(t, err)
	require.True(t, a.Acquired)
	require.NoError(t, repo.Complete(ctx, repository.CompleteParams{Consumer: "billing", Key: "order-1", Owner: "owner-a", Now: now}))

	ttl, err := client.PTTL(ctx, repo.RecordKey("billing", "order-1")).Result()
	require.NoError(t, err)
	require.Positive(t, ttl, "the record must carry a TTL")
	require.LessOrEqual(t, ttl, 500*time.Millisecond)

	require.Eventually(t, func() bool {
		_, err := repo.Get(ctx, "billing", "order-1")
		return errors.Is(err, repository.ErrNotFound)
	}, 10*time.Second, 10*time.Millisecond, "Redis must delete the record at its ExpiresAt")

	n, err := repo.DeleteExpired(ctx, time.Now(), 100)
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestKeyLayout(t *testing.T) {
	client := testenv.Redis(t)
	repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: "inbox:"})
	require.NoError(t, err)
	require.Equal(t, "inbox:{billing:order-1}", repo.RecordKey("billing", "order-1"))

	long := strings.Repeat("k", repository.MaxKeyLength+1)
	require.Equal(t, "inbox:{billing:"+repository.StorageKey(long)+"}", repo.RecordKey("billing", long))

	// A ':' in the consumer cannot make two pairs share a Redis key.
	require.NotEqual(t, repo.RecordKey("a:b", "c"), repo.RecordKey("a", "b:c"))
	require.Equal(t, "inbox:{a%3Ab%7B%7D%25:c}", repo.RecordKey("a:b{}%", "c"))

	def, err := redis.NewRepository(client, redis.Config{})
	require.NoError(t, err)
	require.Equal(t, redis.DefaultKeyPrefix+"{billing:order-1}", def.RecordKey("billing", "order-1"))
}

func TestConsumerWithColonIsIsolated(t *testing.T) {
	t.Parallel()
	_, repo := newRepository(t)
	ctx := t.Context()
	now := time.Now()
	for _, p := range [][2]string{{"a:b", "c"}, {"a", "b:c"}} {
		a, err := repo.Acquire(ctx, repository.AcquireParams{
			Consumer: p[0], Key: p[1], Owner: "o",
			Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
		})
		require.NoError(t, err)
		require.True(t, a.Acquired, "%q/%q must be its own record", p[0], p[1])
	}
	rec, err := repo.Get(ctx, "a:b", "c")
	require.NoError(t, err)
	require.Equal(t, "a:b", rec.Consumer)
	require.Equal(t, "c", rec.Key)
}

func TestInvalidConfigIsRefused(t *testing.T) {
	client := testenv.Redis(t)
	for _, prefix := range []string{"inbox{", "in}box:", "{tag}:", strings.Repeat("p", redis.MaxKeyPrefixLength+1)} {
		repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: prefix})
		require.ErrorIs(t, err, redis.ErrInvalidKeyPrefix, "prefix %q", prefix)
		require.Nil(t, repo)
	}
	_, err := redis.NewRepository(nil, redis.Config{})
	require.Error(t, err)
}

func TestServerErrorsAreWrapped(t *testing.T) {
	_, repo := newRepository(t)
	now := time.Now()
	params := repository.AcquireParams{
		Consumer: "c", Key: "k", Owner: "o", Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := repo.Acquire(ctx, params)
	require.ErrorIs(t, err, context.Canceled)

	closed := testenv.Redis(t)
	repo, err = redis.NewRepository(closed, redis.Config{})
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	_, err = repo.Acquire(t.Context(), params)
	require.ErrorIs(t, err, goredis.ErrClosed)
	_, err = repo.Get(t.Context(), "c", "k")
	require.ErrorIs(t, err, goredis.ErrClosed)
}

func BenchmarkRepository(b *testing.B) { runBench(b, "redis", testenv.Redis(b)) }

// runBench runs the repotest benchmarks on client.
func runBench(b *testing.B, name string, client goredis.UniversalClient) {
	repotest.Bench(b, repotest.BenchBackend{
		Name:     name,
		Features: repotest.Features{TwoPhase: true, NoSQLTable: true, ExpiryByTTL: true},
		New: func(tb testing.TB, table string) (repotest.Repository, error) {
			prefix := "watermill-idempotent-bench:" + table + ":"
			testenv.DeleteRedisKeysOnCleanup(tb, client, prefix)
			return redis.NewRepository(client, redis.Config{KeyPrefix: prefix})
		},
	})
}

// newRepository returns a Repository under a prefix of the test's own on
// the test Redis, and its client.
func newRepository(t *testing.T) (*goredis.Client, *redis.Repository) {
	t.Helper()
	client := testenv.Redis(t)
	repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: testenv.RedisPrefix(t, client)})
	require.NoError(t, err)
	return client, repo
}
