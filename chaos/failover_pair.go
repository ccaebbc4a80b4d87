package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Replication modes of the failover run.
const (
	// Async is PostgreSQL's default streaming replication: a commit is
	// acknowledged once it is durable on the primary.
	Async = "async"
	// Sync is synchronous_standby_names = '*' with synchronous_commit =
	// on: a commit waits until the standby has flushed its WAL.
	Sync = "sync"
	// RemoteApply is Sync with synchronous_commit = remote_apply: a
	// commit waits until the standby has applied it (visible to its
	// readers).
	RemoteApply = "remote_apply"
)

// Default ports of the failover pair. The shared cluster (5432) and the
// fault suite's (5437) are never used.
const (
	DefaultFailoverPrimaryPort = 5440
	DefaultFailoverReplicaPort = 5441
)

// pairHBA trusts loopback connections, replication included.
const pairHBA = `# Written by the watermill-idempotent chaos suite (chaos, failover).
local all all trust
host  all all 127.0.0.1/32 trust
local replication all trust
host  replication all 127.0.0.1/32 trust
`

// pairSettings are the settings of both clusters; the primary's add the
// mode's synchronous settings. A promoted replica runs without them, as
// Patroni's synchronous_mode (not _strict) does when no standby is left:
// otherwise every commit on the new primary would wait forever.
func pairSettings(mode string) string {
	s := clusterSettings + `wal_level = replica
max_wal_senders = 10
hot_standby = on
wal_receiver_status_interval = 1s
`
	switch mode {
	case Sync:
		s += "synchronous_standby_names = '*'\nsynchronous_commit = on\n"
	case RemoteApply:
		s += "synchronous_standby_names = '*'\nsynchronous_commit = remote_apply\n"
	}
	return s
}

// pair is a primary and its streaming replica on private ports. Each
// reset makes a the primary again and b a fresh copy of it.
type pair struct {
	a, b cluster
}

func newPair(version string, primaryPort, replicaPort int) pair {
	return pair{
		a: cluster{version: version, name: "ha-a", port: primaryPort, hba: pairHBA},
		b: cluster{version: version, name: "ha-b", port: replicaPort, hba: pairHBA},
	}
}

// DSN is a multi-host DSN over both clusters that connects only to the
// one accepting writes (target_session_attrs=read-write), as a service
// would be configured to follow a failover.
func (p pair) DSN(app string) string {
	q := url.Values{}
	q.Set("sslmode", "disable")
	q.Set("application_name", app)
	q.Set("connect_timeout", "2")
	q.Set("target_session_attrs", "read-write")
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?%s", p.a.port, p.b.port, q.Encode())
}

func (c cluster) dataDir() string {
	return filepath.Join("/var/lib/postgresql", c.version, c.name)
}

// reset stops both clusters, starts a as the primary with mode's
// settings, replaces b's data with a pg_basebackup of a (standby.signal
// and primary_conninfo written by -R), starts b and waits until it
// streams (and, for the synchronous modes, is the sync standby).
func (p pair) reset(ctx context.Context, mode string) error {
	for _, c := range []cluster{p.a, p.b} {
		if err := c.safe(); err != nil {
			return err
		}
		if running, _ := c.running(ctx); running {
			if err := c.ctl(ctx, "stop", "-m", "immediate"); err != nil {
				return err
			}
		}
	}
	a, b := p.a, p.b
	a.settings, b.settings = pairSettings(mode), pairSettings(Async)
	// a was stopped above, so ensure starts it with the mode's settings.
	if err := a.ensure(ctx); err != nil {
		return err
	}
	if _, exists, err := b.lookup(ctx); err != nil {
		return err
	} else if !exists {
		// Created (initdb) and started once; its data is replaced below.
		if err := b.ensure(ctx); err != nil {
			return err
		}
		if err := b.ctl(ctx, "stop", "-m", "immediate"); err != nil {
			return err
		}
	} else if err := b.configure(); err != nil {
		return err
	}
	dir := b.dataDir()
	if !strings.HasSuffix(dir, "/ha-b") {
		return fmt.Errorf("refusing to wipe %s", dir)
	}
	if err := emptyDataDir(dir); err != nil {
		return err
	}
	admin, err := openDB(a.DSN("chaos-admin"), 2)
	if err != nil {
		return err
	}
	defer admin.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := waitReady(rctx, admin, "the primary "+a.String()); err != nil {
		return err
	}
	out, err := asPostgres(rctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(a.port), "-U", "postgres",
		"-D", dir, "-R", "-X", "stream", "-c", "fast")
	if err != nil {
		return fmt.Errorf("pg_basebackup: %w\n%s", err, out)
	}
	if err := b.ctl(rctx, "start"); err != nil {
		return err
	}
	want := `state = 'streaming'`
	if mode != Async {
		want += ` AND sync_state = 'sync'`
	}
	for {
		var n int
		if err := admin.QueryRowContext(rctx, `SELECT count(*) FROM pg_stat_replication WHERE `+want).Scan(&n); err == nil && n == 1 {
			return nil
		}
		select {
		case <-rctx.Done():
			return fmt.Errorf("the replica %s does not stream from %s (%s): %w", b, a, want, rctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop stops both clusters (fast), leaving them for the next run.
func (p pair) stop(ctx context.Context) error {
	return errors.Join(p.a.stop(ctx), p.b.stop(ctx))
}

// emptyDataDir leaves dir empty, owned by the postgres user with mode
// 0700, for pg_basebackup (its parent may belong to root).
func emptyDataDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return err
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	return os.Chown(dir, uid, gid)
}

// asPostgres runs a PostgreSQL tool as the postgres user when this
// process is root (pg_basebackup must write files postgres owns).
func asPostgres(ctx context.Context, name string, args ...string) ([]byte, error) {
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}

// postmaster reads the postmaster's pid from postmaster.pid.
func (c cluster) postmaster() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.dataDir(), "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// crash kills the cluster as a lost machine would: the postmaster is
// frozen (SIGSTOP, so it forks no more), then it and every process it
// started get SIGKILL. Nothing is flushed or shut down.
func (c cluster) crash() error {
	if err := c.safe(); err != nil {
		return err
	}
	pid, err := c.postmaster()
	if err != nil {
		return fmt.Errorf("crash %s: %w", c, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("crash %s: SIGSTOP postmaster %d: %w", c, pid, err)
	}
	children, err := childrenOf(pid)
	if err != nil {
		return err
	}
	var errs []error
	for _, child := range children {
		errs = append(errs, ignoreGone(syscall.Kill(child, syscall.SIGKILL)))
	}
	errs = append(errs, ignoreGone(syscall.Kill(pid, syscall.SIGKILL)))
	return errors.Join(errs...)
}

func ignoreGone(err error) error {
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// childrenOf lists the processes whose parent is pid (/proc/*/stat).
func childrenOf(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) >= 2 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out, nil
}

// walReceiver returns the pid of the replica's WAL receiver.
func walReceiver(ctx context.Context, replica *sql.DB) (int, error) {
	var pid int
	err := replica.QueryRowContext(ctx, `SELECT pid FROM pg_stat_wal_receiver`).Scan(&pid)
	if err != nil {
		return 0, fmt.Errorf("finding the replica's WAL receiver: %w", err)
	}
	return pid, nil
}

// promote promotes b (pg_ctl promote waits until it accepts writes).
func (p pair) promote(ctx context.Context) error {
	return p.b.ctl(ctx, "promote")
}

// StartPair makes the private pair of config ready in one replication
// mode and leaves it running (for benchmarks against a synchronous
// replica); it returns the primary's DSN. StopPair stops it.
func StartPair(ctx context.Context, config FailoverConfig, mode string) (string, error) {
	config.Modes = []string{mode}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return "", err
	}
	pr := newPair(config.PGVersion, config.PrimaryPort, config.ReplicaPort)
	if err := pr.reset(ctx, mode); err != nil {
		return "", err
	}
	return pr.a.DSN("bench"), nil
}

// StopPair stops both clusters of config's pair.
func StopPair(ctx context.Context, config FailoverConfig) error {
	config.setDefaults()
	return newPair(config.PGVersion, config.PrimaryPort, config.ReplicaPort).stop(ctx)
}
