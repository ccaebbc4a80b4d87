package redis_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/redis"
)

// startPrimaryAndReplica starts a private primary and a replica of it
// (both with DEBUG enabled) and waits until the replica is in sync.
func startPrimaryAndReplica(t testing.TB) (primary, replica *testenv.RedisServer) {
	t.Helper()
	primary = testenv.StartRedisServer(t, "--enable-debug-command", "yes", "--repl-diskless-sync-delay", "0")
	host, port, err := net.SplitHostPort(primary.Addr)
	require.NoError(t, err)
	replica = testenv.StartRedisServer(t, "--enable-debug-command", "yes", "--replicaof", host, port)
	// The primary reports the replica online before the replica has
	// loaded the first sync's data and acknowledged anything: wait until
	// a write of the primary's is acknowledged.
	conn := primary.Client().Conn()
	defer conn.Close()
	require.Eventually(t, func() bool {
		if err := conn.Set(t.Context(), "replica-synced", 1, 0).Err(); err != nil {
			return false
		}
		n, err := conn.Wait(t.Context(), 1, 100*time.Millisecond).Result()
		return err == nil && n == 1
	}, 30*time.Second, 10*time.Millisecond, "the replica must finish its first sync")
	return primary, replica
}

// stall blocks replica's event loop for seconds (DEBUG SLEEP): it reads
// no replication stream and acknowledges nothing. It returns once the
// replica has stopped answering, and a channel closed when it answers
// again.
func stall(t *testing.T, replica *testenv.RedisServer, seconds string) <-chan struct{} {
	t.Helper()
	woke := make(chan struct{})
	sleeper := replica.Client()
	go func() {
		defer close(woke)
		_ = sleeper.Do(context.Background(), "DEBUG", "SLEEP", seconds).Err()
	}()
	probe := goredis.NewClient(&goredis.Options{Addr: replica.Addr, MaxRetries: -1,
		DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond})
	defer probe.Close()
	require.Eventually(t, func() bool { return probe.Ping(t.Context()).Err() != nil },
		10*time.Second, 10*time.Millisecond, "the replica must be asleep")
	return woke
}

// TestDurableWritesWaitForTheReplica shows DurableWrites on a primary
// with one replica: a write returns once the replica has it; with the
// replica stalled it returns ErrNotDurable after DurableTimeout, the
// write standing on the primary only; a call that changes nothing does
// not wait.
func TestDurableWritesWaitForTheReplica(t *testing.T) {
	primary, replica := startPrimaryAndReplica(t)
	ctx := t.Context()
	const timeout = 200 * time.Millisecond
	repo, err := redis.NewRepository(primary.Client(), redis.Config{DurableWrites: 1, DurableTimeout: timeout})
	require.NoError(t, err)
	onReplica, err := redis.NewRepository(replica.Client(), redis.Config{})
	require.NoError(t, err)
	now := time.Now()
	acquire := func(key string) error {
		_, err := repo.Acquire(ctx, repository.AcquireParams{
			Consumer: "c", Key: key, Owner: "o", Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
		})
		return err
	}

	// Acknowledged: the replica has the record when the call returns.
	require.NoError(t, acquire("k1"))
	require.NoError(t, repo.Complete(ctx, repository.CompleteParams{Consumer: "c", Key: "k1", Owner: "o", Now: now}))
	rec, err := onReplica.Get(ctx, "c", "k1")
	require.NoError(t, err, "a durable write is on the replica when it returns")
	require.Equal(t, repository.StateCompleted, rec.State)

	woke := stall(t, replica, "3")
	start := time.Now()
	err = acquire("k2")
	require.ErrorIs(t, err, redis.ErrNotDurable)
	require.ErrorContains(t, err, "0 of 1 replicas acknowledged within 200ms")
	require.GreaterOrEqual(t, time.Since(start), timeout, "the write waits DurableTimeout for the replica")
	rec, err = repo.Get(ctx, "c", "k2")
	require.NoError(t, err, "the write stands on the primary")
	require.Equal(t, repository.StateInProgress, rec.State)
	// A fenced call that changes nothing answers at once, without WAIT.
	err = repo.Complete(ctx, repository.CompleteParams{Consumer: "c", Key: "k2", Owner: "someone else", Now: now})
	require.ErrorIs(t, err, repository.ErrLeaseLost)
	require.NotErrorIs(t, err, redis.ErrNotDurable)

	select {
	case <-woke:
		t.Fatal("the replica woke before the stalled writes were checked: a machine this slow cannot run the case")
	default:
	}
	<-woke
	// Once the replica reads again it catches up, and writes are
	// acknowledged again.
	require.NoError(t, repo.Complete(ctx, repository.CompleteParams{Consumer: "c", Key: "k2", Owner: "o", Now: now}))
	rec, err = onReplica.Get(ctx, "c", "k2")
	require.NoError(t, err)
	require.Equal(t, repository.StateCompleted, rec.State)
}

// TestDurableWritesNeedEnoughReplicas: waiting for more replicas than
// there are fails every write with ErrNotDurable, saying how many
// acknowledged.
func TestDurableWritesNeedEnoughReplicas(t *testing.T) {
	primary, _ := startPrimaryAndReplica(t)
	repo, err := redis.NewRepository(primary.Client(), redis.Config{DurableWrites: 2, DurableTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	now := time.Now()
	_, err = repo.Acquire(t.Context(), repository.AcquireParams{
		Consumer: "c", Key: "k", Owner: "o", Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
	})
	require.ErrorIs(t, err, redis.ErrNotDurable)
	require.ErrorContains(t, err, "1 of 2 replicas acknowledged")
}

// wrappedClient is a UniversalClient go-redis does not know: it cannot
// pin WAIT to the write's connection.
type wrappedClient struct{ *goredis.Client }

func TestDurableConfigIsValidated(t *testing.T) {
	client := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr()})
	defer client.Close()
	for _, c := range []struct {
		config redis.Config
		field  string
	}{
		{redis.Config{DurableWrites: -1}, "DurableWrites"},
		{redis.Config{DurableWrites: 1, DurableTimeout: -time.Second}, "DurableTimeout"},
		{redis.Config{DurableWrites: 1, DurableTimeout: time.Microsecond}, "DurableTimeout"},
	} {
		repo, err := redis.NewRepository(client, c.config)
		require.ErrorContains(t, err, c.field)
		require.Nil(t, repo)
	}
	err := redis.Config{DurableWrites: -1, DurableTimeout: -1}.Validate()
	require.ErrorContains(t, err, "DurableWrites")
	require.ErrorContains(t, err, "DurableTimeout", "every invalid field is reported")

	_, err = redis.NewRepository(wrappedClient{client}, redis.Config{DurableWrites: 1})
	require.ErrorContains(t, err, "DurableWrites")
	_, err = redis.NewRepository(wrappedClient{client}, redis.Config{})
	require.NoError(t, err, "without DurableWrites any UniversalClient works")
}

// BenchmarkDurableWrites measures what DurableWrites costs: Acquire and
// Complete of a fresh key on a private primary with one replica, without
// and with waiting for the replica.
func BenchmarkDurableWrites(b *testing.B) {
	for _, durable := range []int{0, 1} {
		b.Run(fmt.Sprintf("DurableWrites=%d", durable), func(b *testing.B) {
			primary, _ := startPrimaryAndReplica(b)
			repo, err := redis.NewRepository(primary.Client(), redis.Config{DurableWrites: durable})
			require.NoError(b, err)
			ctx := b.Context()
			b.ResetTimer()
			for i := range b.N {
				key := strconv.Itoa(i)
				now := time.Now()
				a, err := repo.Acquire(ctx, repository.AcquireParams{
					Consumer: "c", Key: key, Owner: "o", Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
				})
				require.NoError(b, err)
				require.True(b, a.Acquired)
				require.NoError(b, repo.Complete(ctx, repository.CompleteParams{Consumer: "c", Key: key, Owner: "o", Now: now}))
			}
		})
	}
}

// TestDurableWritesThroughARing: through a *redis.Ring the WAIT goes to
// the shard that holds the key, on the write's connection — on another
// connection, without writes of its own, WAIT would answer at once, even
// with the replica stalled.
func TestDurableWritesThroughARing(t *testing.T) {
	primary, replica := startPrimaryAndReplica(t)
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"shard": primary.Addr}})
	defer ring.Close()
	repo, err := redis.NewRepository(ring, redis.Config{DurableWrites: 1, DurableTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	onReplica, err := redis.NewRepository(replica.Client(), redis.Config{})
	require.NoError(t, err)
	ctx := t.Context()
	now := time.Now()
	acquire := func(key string) error {
		_, err := repo.Acquire(ctx, repository.AcquireParams{
			Consumer: "c", Key: key, Owner: "o", Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
		})
		return err
	}
	require.NoError(t, acquire("k1"))
	rec, err := onReplica.Get(ctx, "c", "k1")
	require.NoError(t, err, "a durable write is on the replica when it returns")
	require.Equal(t, repository.StateInProgress, rec.State)

	woke := stall(t, replica, "2")
	require.ErrorIs(t, acquire("k2"), redis.ErrNotDurable)
	<-woke
}
