package redis_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/redis"
)

// persistenceModes are the Redis persistence settings docs/storage.md
// compares: none (the shared test server's, and redis-server's without a
// configuration file apart from RDB snapshots), AOF written every second,
// and AOF fsynced before every reply.
var persistenceModes = []struct {
	name string
	args []string
}{
	{"appendonly=no", []string{"--appendonly", "no"}},
	{"appendfsync=everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}},
	{"appendfsync=always", []string{"--appendonly", "yes", "--appendfsync", "always"}},
}

// TestRestartLosesRecordsWithoutAOF crashes a private Redis (SIGKILL)
// holding 200 completed records and one in-flight lease, starts it again
// on the same files, and counts what survived. Without persistence
// everything is gone: every completed key would be processed again, and
// the in-flight key can be acquired by a second attempt while the first
// still runs (Intervene cannot protect it). With appendonly yes and
// appendfsync always, everything survives. (A process crash cannot tell
// always from everysec: both have written the AOF before replying; they
// differ on an operating-system crash or power loss, which the test
// cannot cause.)
func TestRestartLosesRecordsWithoutAOF(t *testing.T) {
	const completed = 200
	for _, mode := range []struct {
		name  string
		args  []string
		keeps bool
	}{
		{"appendonly=no", persistenceModes[0].args, false},
		{"appendfsync=always", persistenceModes[2].args, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			server := testenv.StartRedisServer(t, mode.args...)
			ctx := t.Context()
			repo, err := redis.NewRepository(server.Client(), redis.Config{})
			require.NoError(t, err)
			now := time.Now()
			acquire := func(repo *redis.Repository, key, owner string) repository.Acquisition {
				t.Helper()
				a, err := repo.Acquire(ctx, repository.AcquireParams{
					Consumer: "payments", Key: key, PayloadHash: repository.HashPayload([]byte(key)), Owner: owner,
					Now: time.Now(), LeaseUntil: time.Now().Add(time.Minute), ExpiresAt: now.Add(24 * time.Hour),
				})
				require.NoError(t, err)
				return a
			}
			for i := range completed {
				key := fmt.Sprintf("order-%d", i)
				require.True(t, acquire(repo, key, "first").Acquired)
				require.NoError(t, repo.Complete(ctx, repository.CompleteParams{
					Consumer: "payments", Key: key, Owner: "first", Result: []byte("paid"), Now: time.Now(),
				}))
			}
			require.True(t, acquire(repo, "in-flight", "first").Acquired)

			server.Kill()
			server.Start()

			repo, err = redis.NewRepository(server.Client(), redis.Config{})
			require.NoError(t, err)
			reprocessed := 0
			for i := range completed {
				if acquire(repo, fmt.Sprintf("order-%d", i), "after-restart").Acquired {
					reprocessed++
				}
			}
			inFlight := acquire(repo, "in-flight", "after-restart")
			t.Logf("%s: after a crash and restart, %d of %d completed keys would be processed again; in-flight lease kept: %v",
				mode.name, reprocessed, completed, !inFlight.Acquired)
			if mode.keeps {
				require.Zero(t, reprocessed)
				require.False(t, inFlight.Acquired, "the live lease still protects the in-flight effect")
				require.Equal(t, repository.StateInProgress, inFlight.Existing.State)
				require.Equal(t, "first", inFlight.Existing.LeaseOwner)
			} else {
				require.Equal(t, completed, reprocessed)
				require.True(t, inFlight.Acquired, "the in-flight lease is gone: a second attempt runs the effect")
			}
		})
	}
}

// BenchmarkPersistence measures a two-phase delivery's store work
// (Acquire, then Complete with a small result) on a private Redis in each
// persistence mode, one caller at a time and 16 at once. Run it with
//
//	go test -run '^$' -bench BenchmarkPersistence -benchtime 3s ./repository/redis
func BenchmarkPersistence(b *testing.B) {
	for _, mode := range persistenceModes {
		b.Run(mode.name, func(b *testing.B) {
			server := testenv.StartRedisServer(b, mode.args...)
			repo, err := redis.NewRepository(server.Client(), redis.Config{})
			if err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			deliver := func(ctx context.Context) error {
				key := fmt.Sprintf("order-%d", seq.Add(1))
				now := time.Now()
				a, err := repo.Acquire(ctx, repository.AcquireParams{
					Consumer: "bench", Key: key, PayloadHash: repository.HashPayload([]byte(key)), Owner: "owner",
					Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
				})
				if err != nil {
					return err
				}
				if !a.Acquired {
					return fmt.Errorf("fresh key %s held", key)
				}
				return repo.Complete(ctx, repository.CompleteParams{Consumer: "bench", Key: key, Owner: "owner", Result: []byte("result"), Now: now})
			}
			b.Run("sequential", func(b *testing.B) {
				for b.Loop() {
					if err := deliver(b.Context()); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
			b.Run("parallel16", func(b *testing.B) {
				b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // 16 goroutines
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := deliver(context.Background()); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			})
		})
	}
}
