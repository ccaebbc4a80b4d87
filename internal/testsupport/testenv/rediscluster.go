package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis Cluster environment variable and its default: the six nodes
// (three primaries, three replicas) of the shared test cluster, on
// private ports far from the shared Redis on 6379.
const (
	RedisClusterEnv     = "REDIS_CLUSTER_ADDRS"
	RedisClusterDefault = "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005"
)

// RedisClusterAddrs returns the addresses of the test cluster's nodes.
func RedisClusterAddrs() []string {
	return strings.Split(getenv(RedisClusterEnv, RedisClusterDefault), ",")
}

// clusterArgs are the redis-server directives that make a node a
// cluster node: cluster mode, no AOF, and a short node timeout, so a
// killed primary is failed over within seconds. The replica validity
// factor 0 lets a replica take over however long ago it last heard from
// its primary (with the default 10, Redis 7.0 refused to fail over a
// freshly created cluster's killed primary here). A replica's first sync
// starts at once instead of after the default 5 s diskless-sync delay.
var clusterArgs = []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
	"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0", "--appendonly", "no"}

var sharedCluster struct {
	once sync.Once
	err  error
}

// RedisCluster returns a go-redis ClusterClient of the shared test
// cluster (RedisClusterAddrs), closed when t ends. A healthy cluster
// already there is reused; otherwise its nodes are started as daemons
// (redis-server --cluster-enabled yes, files under the system temporary
// directory) and joined with redis-cli --cluster create, 3 primaries and
// 3 replicas, and it waits until every node reports cluster_state:ok.
// The daemons outlive the test, so later runs reuse them. Without
// redis-server and redis-cli, or when the cluster does not come up, the
// test is skipped, or fails under CI=true. Tests share the cluster: give
// each its own key prefix.
func RedisCluster(t testing.TB) *redis.ClusterClient {
	t.Helper()
	addrs := RedisClusterAddrs()
	sharedCluster.once.Do(func() { sharedCluster.err = ensureRedisCluster(addrs) })
	if sharedCluster.err != nil {
		Missing(t, "Redis Cluster ("+RedisClusterEnv+"="+strings.Join(addrs, ",")+")", sharedCluster.err)
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// ensureRedisCluster reuses the cluster at addrs when it is healthy, and
// otherwise starts the nodes that do not answer and creates the cluster.
func ensureRedisCluster(addrs []string) error {
	if len(addrs) != 6 {
		return fmt.Errorf("want 6 node addresses (3 primaries, 3 replicas), got %d", len(addrs))
	}
	if clusterHealthy(addrs) == nil {
		return nil
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	root := filepath.Join(os.TempDir(), "watermill-idempotent-redis-cluster")
	unlock, err := lockDir(root)
	if err != nil {
		return err
	}
	defer unlock()
	if clusterHealthy(addrs) == nil { // another test process made it meanwhile
		return nil
	}
	for _, addr := range addrs {
		if pingAddr(addr) == nil {
			continue
		}
		host, portStr, err := net.SplitHostPort(addr)
		if err != nil {
			return err
		}
		if host != "127.0.0.1" && host != "localhost" {
			return fmt.Errorf("node %s does not answer and is not local, cannot start it", addr)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return err
		}
		dir := filepath.Join(root, portStr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "no",
			"--dir", dir, "--save", "", "--daemonize", "yes", "--logfile", filepath.Join(dir, "redis.log")}, clusterArgs...)
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("start %s: %v: %s", addr, err, out)
		}
		if err := waitFor(10*time.Second, func() error { return pingAddr(addr) }); err != nil {
			return fmt.Errorf("node %s started but does not answer: %w", addr, err)
		}
	}
	// Restarted nodes with their nodes.conf rejoin by themselves.
	if waitFor(5*time.Second, func() error { return clusterHealthy(addrs) }) == nil {
		return nil
	}
	return createCluster(addrs, 30*time.Second)
}

// createCluster joins fresh nodes into a cluster of len(addrs)/2
// primaries with one replica each and waits until it is healthy.
func createCluster(addrs []string, wait time.Duration) error {
	for _, addr := range addrs {
		n, err := knownNodes(addr)
		if err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("node %s already knows %d nodes but the cluster is not healthy (%v); "+
				"stop the nodes and delete their nodes-*.conf to recreate it", addr, n, clusterHealthy(addrs))
		}
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return err
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	return waitFor(wait, func() error { return clusterHealthy(addrs) })
}

// clusterHealthy reports nil when every node answers CLUSTER INFO with
// cluster_state:ok, knows all the nodes, the cluster has len(addrs)/2
// primaries serving slots, and every replica's link to its primary is up
// (its first sync done: before it, a killed primary loses everything).
func clusterHealthy(addrs []string) error {
	for _, addr := range addrs {
		info, err := nodeHealthy(addr)
		if err != nil {
			return err
		}
		if info["cluster_known_nodes"] != strconv.Itoa(len(addrs)) || info["cluster_size"] != strconv.Itoa(len(addrs)/2) {
			return fmt.Errorf("%s: cluster_known_nodes:%s cluster_size:%s", addr, info["cluster_known_nodes"], info["cluster_size"])
		}
	}
	return nil
}

// nodeHealthy reports nil when the node at addr says cluster_state:ok
// and, if it is a replica, master_link_status:up. It returns the node's
// CLUSTER INFO.
func nodeHealthy(addr string) (map[string]string, error) {
	info, err := clusterInfo(addr)
	if err != nil {
		return nil, err
	}
	if info["cluster_state"] != "ok" {
		return nil, fmt.Errorf("%s: cluster_state:%s", addr, info["cluster_state"])
	}
	repl, err := infoSection(addr, "replication")
	if err != nil {
		return nil, err
	}
	if repl["role"] == "slave" && repl["master_link_status"] != "up" {
		return nil, fmt.Errorf("%s: replica's master_link_status:%s", addr, repl["master_link_status"])
	}
	return info, nil
}

func clusterInfo(addr string) (map[string]string, error) { return infoSection(addr, "cluster") }

// infoSection reads CLUSTER INFO (section "cluster") or one INFO section
// of the node at addr as field → value.
func infoSection(addr, section string) (map[string]string, error) {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var s string
	var err error
	if section == "cluster" {
		s, err = client.ClusterInfo(ctx).Result()
	} else {
		s, err = client.Info(ctx, section).Result()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %s info: %w", addr, section, err)
	}
	info := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			info[k] = v
		}
	}
	return info, nil
}

func knownNodes(addr string) (int, error) {
	info, err := clusterInfo(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(info["cluster_known_nodes"])
}

func pingAddr(addr string) error {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return client.Ping(ctx).Err()
}

// waitFor polls check every 100ms until it returns nil or d has passed,
// and returns its last error.
func waitFor(d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lockDir takes an exclusive lock between processes (a directory made
// with mkdir, which is atomic) under root, breaking a lock older than two
// minutes left by a crashed process.
func lockDir(root string) (func(), error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	lock := filepath.Join(root, "lock")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := os.Mkdir(lock, 0o755)
		if err == nil {
			return func() { _ = os.Remove(lock) }, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		if fi, err := os.Stat(lock); err == nil && time.Since(fi.ModTime()) > 2*time.Minute {
			_ = os.Remove(lock)
			continue
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("lock %s held for two minutes", lock)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// PrivateRedisCluster is a Redis Cluster of the test's own — three
// primaries and three replicas, each a RedisServer on a free port with
// its files in the test's temporary directory and the DEBUG command
// enabled — for fault tests that kill, stall or fail over nodes. It is
// stopped when the test ends.
type PrivateRedisCluster struct {
	// Nodes are the six servers, in the order they were given to
	// redis-cli --cluster create (the first three start as primaries).
	Nodes []*RedisServer
}

// StartRedisCluster starts a PrivateRedisCluster and waits until every
// node reports cluster_state:ok. Without redis-server and redis-cli the
// test is skipped, or fails under CI=true.
func StartRedisCluster(t testing.TB) *PrivateRedisCluster {
	t.Helper()
	c := &PrivateRedisCluster{}
	addrs := make([]string, 6)
	for i := range addrs {
		// DEBUG SLEEP lets fault tests stall a node.
		s := StartRedisServer(t, slices.Concat(clusterArgs, []string{"--enable-debug-command", "yes"})...)
		c.Nodes = append(c.Nodes, s)
		addrs[i] = s.Addr
	}
	if _, err := exec.LookPath("redis-cli"); err != nil {
		Missing(t, "redis-cli binary (for a private Redis Cluster)", err)
	}
	if err := createCluster(addrs, 30*time.Second); err != nil {
		t.Fatalf("private redis cluster: %v", err)
	}
	return c
}

// Addrs returns the nodes' addresses.
func (c *PrivateRedisCluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Client returns a ClusterClient of the cluster, closed when the test
// ends.
func (c *PrivateRedisCluster) Client(t testing.TB) *redis.ClusterClient {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// Healthy reports nil when the given (running) nodes all report
// cluster_state:ok and those that are replicas have their link to their
// primary up. A replica of a killed primary that was not promoted keeps
// its link down: leave it out.
func (c *PrivateRedisCluster) Healthy(running ...*RedisServer) error {
	for _, n := range running {
		if _, err := nodeHealthy(n.Addr); err != nil {
			return err
		}
	}
	return nil
}

// Redis abandons a manual failover that has not promoted the replica
// within 5 s of CLUSTER FAILOVER (CLUSTER_MF_TIMEOUT; "Manual failover
// timed out." in the replica's log) and never tries it again: the
// primary resumes writes and the replica stays a replica. After
// manualFailoverWait an attempt is over either way, so ManualFailover
// can send the command again without overlapping an election.
const (
	manualFailoverWait     = 10 * time.Second
	manualFailoverAttempts = 3
)

// ManualFailover makes replica, a replica of primary, the primary of
// primary's slots with CLUSTER FAILOVER — without FORCE, so primary
// stops taking writes until replica has processed its whole replication
// stream and nothing primary acknowledged is lost — and waits until
// replica says it is a primary. Every node of the cluster must be
// running. It returns the number of CLUSTER FAILOVER commands it sent.
//
// An OK reply only schedules the failover, and Redis drops it for good
// when it is not done in 5 s: primary ignores the request of a node it
// does not know as its replica yet, and the election fails without the
// votes of a majority of primaries — a voter denies a replica whose
// primary it does not know or whose epoch is behind its own, and an
// auth request or vote sent while a cluster-bus link is down is lost (a
// node that does not answer for half the node timeout, 500 ms here, has
// its links closed and reopened). So before each attempt ManualFailover
// waits until the nodes agree: every node sees replica as a replica of
// primary, none flags a node as failing, all are on the same current
// epoch, and primary streams to replica. An attempt that has not
// promoted replica after 10 s is logged with every node's view and log
// and made again, up to 3 times; then the test fails.
func (c *PrivateRedisCluster) ManualFailover(t testing.TB, replica, primary *RedisServer) int {
	t.Helper()
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: replica.Addr, MaxRetries: -1})
	defer client.Close()
	replicaID, err := client.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatalf("manual failover: %s: %v", replica.Addr, err)
	}
	primaryID, err := primary.Client().ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatalf("manual failover: %s: %v", primary.Addr, err)
	}
	promoted := func() error {
		role, err := client.Do(ctx, "ROLE").Slice()
		if err != nil {
			return err
		}
		if len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("%s: ROLE %v", replica.Addr, role)
		}
		return nil
	}
	for attempt := 1; ; attempt++ {
		ready := func() error { return c.failoverReady(replica, replicaID, primary, primaryID) }
		if err := waitFor(30*time.Second, ready); err != nil {
			t.Fatalf("manual failover of %s to %s, attempt %d: the nodes do not agree on the topology: %v\n%s",
				primary.Addr, replica.Addr, attempt, err, c.report())
		}
		if err := client.ClusterFailover(ctx).Err(); err != nil {
			t.Fatalf("manual failover of %s to %s, attempt %d: CLUSTER FAILOVER: %v\n%s",
				primary.Addr, replica.Addr, attempt, err, c.report())
		}
		err := waitFor(manualFailoverWait, promoted)
		if err == nil {
			return attempt
		}
		if attempt == manualFailoverAttempts {
			t.Fatalf("manual failover of %s to %s: not promoted after %d attempts of %s: %v\n%s",
				primary.Addr, replica.Addr, attempt, manualFailoverWait, err, c.report())
		}
		t.Logf("manual failover of %s to %s, attempt %d: not promoted after %s (%v); Redis gave it up, sending CLUSTER FAILOVER again\n%s",
			primary.Addr, replica.Addr, attempt, manualFailoverWait, err, c.report())
	}
}

// failoverReady reports nil when every node is healthy (nodeHealthy),
// sees replica as a replica of primary and no node as failing (PFAIL or
// FAIL), all nodes are on the same current epoch, and primary lists
// replica as an online replica.
func (c *PrivateRedisCluster) failoverReady(replica *RedisServer, replicaID string, primary *RedisServer, primaryID string) error {
	epoch := ""
	for _, n := range c.Nodes {
		info, err := nodeHealthy(n.Addr)
		if err != nil {
			return err
		}
		if epoch == "" {
			epoch = info["cluster_current_epoch"]
		} else if info["cluster_current_epoch"] != epoch {
			return fmt.Errorf("%s: cluster_current_epoch:%s, another node's is %s", n.Addr, info["cluster_current_epoch"], epoch)
		}
		nodes, err := clusterNodes(n.Addr)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 4 {
				continue
			}
			if strings.Contains(f[2], "fail") {
				return fmt.Errorf("%s sees a failing node: %s", n.Addr, line)
			}
			if f[0] == replicaID && (!strings.Contains(f[2], "slave") || f[3] != primaryID) {
				return fmt.Errorf("%s does not see %s as a replica of %s yet: %s", n.Addr, replica.Addr, primary.Addr, line)
			}
		}
	}
	repl, err := infoSection(primary.Addr, "replication")
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(replica.Addr)
	for k, v := range repl {
		if strings.HasPrefix(k, "slave") && strings.Contains(v, ",port="+port+",") && strings.Contains(v, ",state=online,") {
			return nil
		}
	}
	return fmt.Errorf("%s does not stream to %s: %v", primary.Addr, replica.Addr, repl)
}

// report describes every node for a failure message: its CLUSTER NODES
// line about itself, cluster state, current epoch, role, replication
// offsets, and the end of its log.
func (c *PrivateRedisCluster) report() string {
	var b strings.Builder
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "node %s:\n", n.Addr)
		if nodes, err := clusterNodes(n.Addr); err != nil {
			fmt.Fprintf(&b, "  %v\n", err)
		} else {
			for _, line := range strings.Split(nodes, "\n") {
				if strings.Contains(line, "myself") {
					fmt.Fprintf(&b, "  %s\n", strings.TrimSpace(line))
				}
			}
		}
		cluster, _ := clusterInfo(n.Addr)
		repl, _ := infoSection(n.Addr, "replication")
		fmt.Fprintf(&b, "  cluster_state:%s cluster_current_epoch:%s role:%s master_link_status:%s master_repl_offset:%s slave_repl_offset:%s\n",
			cluster["cluster_state"], cluster["cluster_current_epoch"], repl["role"], repl["master_link_status"],
			repl["master_repl_offset"], repl["slave_repl_offset"])
		log := strings.Split(strings.TrimSpace(n.Log()), "\n")
		for _, line := range log[max(0, len(log)-15):] {
			fmt.Fprintf(&b, "  | %s\n", line)
		}
	}
	return b.String()
}

func clusterNodes(addr string) (string, error) {
	client := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	nodes, err := client.ClusterNodes(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("%s: cluster nodes: %w", addr, err)
	}
	return nodes, nil
}
