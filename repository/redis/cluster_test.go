package redis_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/redis"
)

// TestClusterConformance runs the whole conformance suite through a
// go-redis ClusterClient on a cluster of 3 primaries and 3 replicas: the
// records of one case spread over every primary's slots, so the Operator
// and Stats cases fail if ListStuck or CountRecords miss a node.
func TestClusterConformance(t *testing.T) {
	runConformance(t, "redis-cluster", testenv.RedisCluster(t), redis.Config{})
}

// TestClusterConformanceDurable runs the conformance suite on the same
// cluster with DurableWrites 1: every state change goes to its slot's
// primary on a connection of its own and waits there for the replica.
func TestClusterConformanceDurable(t *testing.T) {
	client := testenv.RedisCluster(t)
	// A replica reports its link up before its primary streams to it
	// (the primary waits for its first acknowledgement): on a cluster
	// just created, wait until every primary's replica acknowledges.
	require.Eventually(t, func() bool {
		// One key in each primary's slots.
		keys := make(map[string]string)
		for i := 0; len(keys) < 3 && i < 1000; i++ {
			key := fmt.Sprintf("watermill-idempotent-test:replica-synced-%d", i)
			if primary, err := client.MasterForKey(t.Context(), key); err == nil {
				keys[primary.Options().Addr] = key
			}
		}
		for _, key := range keys {
			primary, err := client.MasterForKey(t.Context(), key)
			if err != nil {
				return false
			}
			conn := primary.Conn()
			err = conn.Set(t.Context(), key, 1, time.Minute).Err()
			n, waitErr := conn.Wait(t.Context(), 1, 100*time.Millisecond).Result()
			_ = conn.Close()
			if err != nil || waitErr != nil || n != 1 {
				return false
			}
		}
		return len(keys) == 3
	}, 30*time.Second, 10*time.Millisecond, "every primary's replica must acknowledge writes")
	runConformance(t, "redis-cluster-durable", client, redis.Config{DurableWrites: 1})
}

// TestClusterJanitorAndOperatorSeeEveryPrimary seeds records that land on
// all three primaries and checks that the janitor's sample and ListStuck
// count every one of them.
func TestClusterJanitorAndOperatorSeeEveryPrimary(t *testing.T) {
	t.Parallel()
	client := testenv.RedisCluster(t)
	repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: testenv.RedisPrefix(t, client)})
	require.NoError(t, err)
	ctx := t.Context()
	now := time.Now()

	const n = 60
	masters := make(map[string]int)
	for i := range n {
		key := fmt.Sprintf("order-%d", i)
		a, err := repo.Acquire(ctx, repository.AcquireParams{
			Consumer: "billing", Key: key, Owner: "owner",
			Now: now, LeaseUntil: now.Add(time.Second), ExpiresAt: now.Add(time.Hour),
		})
		require.NoError(t, err)
		require.True(t, a.Acquired)
		node, err := client.MasterForKey(ctx, repo.RecordKey("billing", key))
		require.NoError(t, err)
		masters[node.Options().Addr]++
	}
	require.Len(t, masters, 3, "the records must spread over the three primaries: %v", masters)

	var sampled []repository.RecordCount
	j, err := janitor.NewJanitor(repo, janitor.Config{
		Now:      func() time.Time { return now.Add(time.Minute) },
		Observer: sampleFunc(func(s janitor.Sample) { sampled = s.Counts }),
	})
	require.NoError(t, err)
	_, err = j.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []repository.RecordCount{{Consumer: "billing", Stale: n}}, sampled,
		"the janitor's sample must count the records of every primary")

	stuck, err := repo.ListStuck(ctx, repository.ListStuckParams{Now: now.Add(time.Minute), Limit: 1000})
	require.NoError(t, err)
	require.Len(t, stuck, n, "ListStuck must list the records of every primary")
}

// failoverLoss is what a failover cost the completions acknowledged
// before it.
type failoverLoss struct {
	acked, errors, lost, lostOutsideVictim int
	// notDurable counts the attempts that failed with redis.ErrNotDurable
	// (DurableWrites only), during the whole run.
	notDurable int
	// lostBeforeSync counts lost completions acknowledged before the
	// last write the replica was seen to have ("lagging" mode): that
	// write's WAIT on the victim returned 1 just before the replica
	// stalled, and the replica applies the stream in order.
	lostBeforeSync int
	// ackedDuringLag counts completions acknowledged while the replica
	// was stopped, before the kill ("lagging" mode).
	ackedDuringLag int
	maxLostAge     time.Duration // age at the failover of the oldest lost completion
	failoverTook   time.Duration
	// failovers counts the CLUSTER FAILOVER commands sent ("manual"
	// mode): Redis drops one it cannot finish in 5 s.
	failovers int
}

// TestClusterFailoverLoss runs acquire+complete pairs on 8 goroutines
// against a private 3+3 cluster, fails over one primary mid-stream, and
// then reads back every completion Redis acknowledged. A manual failover
// (CLUSTER FAILOVER on the replica) waits for the replica to catch up, so
// nothing acknowledged may be lost; Redis gives one up when the replica
// misses a majority's votes for 5 s, and PrivateRedisCluster's
// ManualFailover sends it again. Killing the primary (SIGKILL) loses
// what it acknowledged but had not yet streamed to its replica — bounded
// by the replication lag, and only in the killed primary's slots; the
// test asserts the latter and logs the counts (docs/scaling.md). The
// "lagging" mode makes the lag large on purpose — the replica stops
// reading the replication stream (DEBUG SLEEP) while completions go on,
// then its primary is killed — and asserts what the replica is known to
// have: nothing acknowledged before a write whose WAIT the replica
// answered just before it stalled is lost. How much of the rest is lost
// depends on the socket buffers and the machine's speed: it is logged,
// not asserted.
//
// The "+durable" modes run the same with Config.DurableWrites 1: a write
// is acknowledged only once the replica has it, so nothing acknowledged
// may be lost, even from a replica stalled for seconds. The promoted
// replica has no replica of its own, so every write to the failed
// primary's slots fails with ErrNotDurable until the killed node is
// started again and rejoins as its replica; the test does that.
func TestClusterFailoverLoss(t *testing.T) {
	for _, mode := range []string{"manual", "kill", "lagging", "kill+durable", "lagging+durable"} {
		t.Run(mode, func(t *testing.T) {
			if mode != "manual" && testing.Short() {
				t.Skip("-short: a killed primary's failover takes 20 s to a minute")
			}
			if strings.HasSuffix(mode, "+durable") && raceEnabled {
				// go-redis v9.23.0 races with itself in (*baseClient).initConn
				// when ClusterClient.MasterForKey reloads the cluster state
				// during the failover: a data race in the client, not in the
				// repository. make chaos-ci runs these without -race.
				t.Skip("race detector: go-redis's own race in MasterForKey's reload; run by make chaos-ci without -race")
			}
			loss := runFailover(t, mode)
			t.Logf("%s failover: %d completions acknowledged (%d while the replica lagged), %d errors during the failover "+
				"(%d ErrNotDurable in the run), %d lost (%d acknowledged before the replica's last answered WAIT; "+
				"oldest lost acknowledged %s before the failover), failover took %s (%d CLUSTER FAILOVER commands)",
				mode, loss.acked, loss.ackedDuringLag, loss.errors, loss.notDurable, loss.lost, loss.lostBeforeSync,
				loss.maxLostAge, loss.failoverTook, loss.failovers)
			require.Zero(t, loss.lostOutsideVictim, "only the failed primary's slots may lose writes")
			switch mode {
			case "manual":
				require.Zero(t, loss.lost, "a manual failover waits for the replica: nothing acknowledged may be lost")
			case "lagging":
				require.Zero(t, loss.lostBeforeSync, "the replica had every completion acknowledged before its last answered WAIT")
			case "kill+durable", "lagging+durable":
				require.Zero(t, loss.lost, "with DurableWrites the replica has every acknowledged write")
			}
		})
	}
}

// errAcquireRetried marks a completion runFailover did not make: its
// Acquire ran twice.
var errAcquireRetried = errors.New("acquire of a new key found it taken")

func runFailover(t *testing.T, mode string) failoverLoss {
	cluster := testenv.StartRedisCluster(t)
	client := cluster.Client(t)
	config := redis.Config{KeyPrefix: "failover:"}
	durable := strings.HasSuffix(mode, "+durable")
	mode = strings.TrimSuffix(mode, "+durable")
	if durable {
		config.DurableWrites = 1
	}
	repo, err := redis.NewRepository(client, config)
	require.NoError(t, err)
	ctx := t.Context()

	victim := cluster.Nodes[0] // redis-cli --cluster create makes the first three primaries
	victimClient := victim.Client()
	victimID, err := victimClient.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	var replica *testenv.RedisServer
	for _, n := range cluster.Nodes[1:] {
		nodes, err := n.Client().ClusterNodes(ctx).Result()
		require.NoError(t, err)
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && strings.Contains(f[2], "myself") && strings.Contains(f[2], "slave") && f[3] == victimID {
				replica = n
			}
		}
	}
	require.NotNil(t, replica, "the victim primary must have a replica")
	shards, err := victimClient.ClusterShards(ctx).Result()
	require.NoError(t, err)
	var victimSlots [][2]int
	for _, s := range shards {
		for _, n := range s.Nodes {
			if n.ID == victimID {
				for _, r := range s.Slots {
					victimSlots = append(victimSlots, [2]int{int(r.Start), int(r.End)})
				}
			}
		}
	}
	require.NotEmpty(t, victimSlots, "the victim primary must serve slots")

	var (
		mu         sync.Mutex
		ackedAt    = make(map[string]time.Time)
		errs       atomic.Int64
		notDurable atomic.Int64
		seq        atomic.Int64
		stop       = make(chan struct{})
		wg         sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k-%d", seq.Add(1))
				now := time.Now()
				a, err := repo.Acquire(ctx, repository.AcquireParams{
					Consumer: "c", Key: key, Owner: "o", Now: now,
					LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
				})
				if err == nil && !a.Acquired {
					// Every key is new: only an Acquire that go-redis sent
					// again after a timeout (a primary paused by a manual
					// failover Redis gave up holds writes for 5 s) finds its
					// own first run's record. Nothing was completed, so
					// nothing is acknowledged.
					err = errAcquireRetried
				}
				if err == nil {
					err = repo.Complete(ctx, repository.CompleteParams{Consumer: "c", Key: key, Owner: "o", Now: time.Now()})
				}
				if err != nil {
					errs.Add(1)
					if errors.Is(err, redis.ErrNotDurable) {
						notDurable.Add(1)
					}
					continue
				}
				mu.Lock()
				ackedAt[key] = time.Now()
				mu.Unlock()
			}
		}()
	}
	acked := func() int { mu.Lock(); defer mu.Unlock(); return len(ackedAt) }
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 60*time.Second, 10*time.Millisecond, what)
	}
	waitUntil("2000 completions before the failover", func() bool { return acked() >= 2000 })

	var syncedAt time.Time
	ackedDuringLag := 0
	if mode == "lagging" {
		// The replica has every write the victim made before a write of
		// ours that it acknowledged (WAIT), since it applies the stream
		// in order: completions acknowledged before that write was sent
		// cannot be lost. Whatever came after may be, depending on how
		// far the replica had read when it stalled.
		syncedAt = waitForReplica(t, victimClient, victimSlots)
		// DEBUG SLEEP blocks the replica's event loop: it reads no
		// replication stream while its primary keeps acknowledging.
		sleeper := replica.Client()
		woke := make(chan error, 1)
		sleptAt := time.Now()
		go func() { woke <- sleeper.Do(context.Background(), "DEBUG", "SLEEP", "8").Err() }()
		probe := goredis.NewClient(&goredis.Options{Addr: replica.Addr, MaxRetries: -1,
			DialTimeout: 100 * time.Millisecond, ReadTimeout: 100 * time.Millisecond})
		defer probe.Close()
		waitUntil("the replica is asleep", func() bool { return probe.Ping(ctx).Err() != nil })
		// What the primary sent before the kill is in the replica's
		// socket buffer, which the kernel fills while the process
		// sleeps: only what did not fit (megabytes, tens of thousands of
		// completions) is lost. Let the lag grow for up to 6 of the 8 s.
		before := acked()
		waitUntil("the lag grows", func() bool { return acked() >= before+40000 || time.Since(sleptAt) > 6*time.Second })
		ackedDuringLag = acked() - before
		select {
		case err := <-woke:
			t.Fatalf("the replica woke before its primary was killed (%v): a machine this slow cannot run the case", err)
		default:
		}
	}
	failAt := time.Now()
	errsBefore := errs.Load()
	failovers := 0
	switch mode {
	case "manual":
		// Returns once the replica is promoted, or fails the test.
		failovers = cluster.ManualFailover(t, replica, victim)
	case "kill", "lagging":
		victim.Kill()
		// One client for the polls: a new one per poll keeps a
		// connection each until the test ends.
		replicaClient := replica.Client()
		waitUntil("the replica is promoted", func() bool {
			role, err := replicaClient.Do(ctx, "ROLE").Slice()
			return err == nil && len(role) > 0 && role[0] == "master"
		})
	}
	survivors := slices.DeleteFunc(slices.Clone(cluster.Nodes), func(n *testenv.RedisServer) bool { return mode != "manual" && n == victim })
	waitUntil("the cluster is ok again", func() bool { return cluster.Healthy(survivors...) == nil })
	took := time.Since(failAt)
	if durable && mode != "manual" {
		// The promoted replica has no replica: every write to its slots
		// fails with ErrNotDurable until the killed node, started again
		// (empty: no AOF), rejoins as its replica and has synced.
		victim.Start()
		waitUntil("the killed node is back as a replica", func() bool { return cluster.Healthy(cluster.Nodes...) == nil })
	}
	after := acked()
	waitUntil("2000 completions after the failover", func() bool { return acked() >= after+2000 })
	close(stop)
	wg.Wait()

	// Read back through a new client of the surviving nodes: the old one
	// may still route a slot to the dead primary.
	addrs := make([]string, len(survivors))
	for i, n := range survivors {
		addrs[i] = n.Addr
	}
	fresh := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	defer fresh.Close()
	repo, err = redis.NewRepository(fresh, redis.Config{KeyPrefix: config.KeyPrefix})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	loss := failoverLoss{acked: len(ackedAt), errors: int(errs.Load() - errsBefore), failoverTook: took,
		ackedDuringLag: ackedDuringLag, failovers: failovers, notDurable: int(notDurable.Load())}
	for key, at := range ackedAt {
		rec, err := repo.Get(ctx, "c", key)
		if err == nil && rec.State == repository.StateCompleted {
			continue
		}
		if err != nil && !errors.Is(err, repository.ErrNotFound) {
			require.NoError(t, err)
		}
		loss.lost++
		if age := failAt.Sub(at); age > loss.maxLostAge {
			loss.maxLostAge = age
		}
		if mode == "lagging" && at.Before(syncedAt) {
			loss.lostBeforeSync++
		}
		s, err := fresh.ClusterKeySlot(ctx, repo.RecordKey("c", key)).Result()
		require.NoError(t, err)
		if !slices.ContainsFunc(victimSlots, func(r [2]int) bool { return int(s) >= r[0] && int(s) <= r[1] }) {
			loss.lostOutsideVictim++
		}
	}
	return loss
}

// waitForReplica writes a key in the victim's slots and waits (WAIT, on
// the same connection) until the victim's replica has it; it returns when
// the write was sent.
func waitForReplica(t *testing.T, victim *goredis.Client, victimSlots [][2]int) time.Time {
	t.Helper()
	ctx := t.Context()
	key := ""
	for i := 0; key == ""; i++ {
		k := fmt.Sprintf("failover-sync-%d", i)
		s, err := victim.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		if slices.ContainsFunc(victimSlots, func(r [2]int) bool { return int(s) >= r[0] && int(s) <= r[1] }) {
			key = k
		}
	}
	conn := victim.Conn()
	defer conn.Close()
	sent := time.Now()
	require.NoError(t, conn.Set(ctx, key, sent.UnixNano(), 0).Err())
	n, err := conn.Wait(ctx, 1, 10*time.Second).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the victim's replica must acknowledge a write before it stalls")
	return sent
}

func BenchmarkClusterRepository(b *testing.B) {
	runBench(b, "redis-cluster", testenv.RedisCluster(b))
}

// sampleFunc is a janitor.SampleObserver of one function.
type sampleFunc func(janitor.Sample)

func (f sampleFunc) ObserveJanitorBatch(context.Context, janitor.Batch)      {}
func (f sampleFunc) ObserveRecordCounts(_ context.Context, s janitor.Sample) { f(s) }
