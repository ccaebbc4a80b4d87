package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// sharedPort is the shared PostgreSQL every other test uses. The suite
// never stops, restarts or terminates connections on it.
const sharedPort = 5432

// clusterSettings are written to the private cluster's conf.d on every
// run, so a cluster created by hand or by an older run is brought in line.
const clusterSettings = `# Written by the watermill-idempotent chaos suite (chaos).
listen_addresses = '127.0.0.1'
max_connections = 200
shared_buffers = 32MB
fsync = on
synchronous_commit = on
`

// clusterHBA trusts local and loopback connections: the cluster is
// private to this machine and listens on 127.0.0.1 only.
const clusterHBA = `# Written by the watermill-idempotent chaos suite (chaos).
local all all trust
host  all all 127.0.0.1/32 trust
host  all all ::1/128 trust
`

// cluster drives the private PostgreSQL cluster through Debian's
// postgresql-common tools (pg_createcluster, pg_ctlcluster).
type cluster struct {
	version, name string
	port          int
	// settings and hba replace clusterSettings and clusterHBA when set
	// (the failover pair needs replication, the storm a default
	// max_connections).
	settings, hba string
}

func (c cluster) String() string { return fmt.Sprintf("%s/%s on port %d", c.version, c.name, c.port) }

// DSN addresses the cluster's postgres database as application app.
func (c cluster) DSN(app string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&application_name=%s&connect_timeout=5", c.port, app)
}

func (c cluster) confDir() string { return filepath.Join("/etc/postgresql", c.version, c.name) }

// safe refuses to touch anything that could be a shared cluster.
func (c cluster) safe() error {
	if c.port == sharedPort || c.name == "main" || c.name == "" {
		return fmt.Errorf("refusing to manage cluster %s: the shared cluster (main, port %d) is never stopped or restarted", c, sharedPort)
	}
	return nil
}

// ensure creates the cluster if it does not exist, writes its settings
// and starts it. A missing postgresql-common is ErrPrerequisite; other
// failures (for example not being root when the cluster must be created)
// say which command to run.
func (c cluster) ensure(ctx context.Context) error {
	if err := c.safe(); err != nil {
		return err
	}
	for _, tool := range []string{"pg_lsclusters", "pg_createcluster", "pg_ctlcluster"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s (postgresql-common) not found: %v", ErrPrerequisite, tool, err)
		}
	}
	port, exists, err := c.lookup(ctx)
	if err != nil {
		return err
	}
	if exists && port != c.port {
		return fmt.Errorf("cluster %s/%s exists on port %d, not %d: drop it (pg_dropcluster --stop %s %s) or set the port to %d",
			c.version, c.name, port, c.port, c.version, c.name, port)
	}
	if !exists {
		out, err := exec.CommandContext(ctx, "pg_createcluster", c.version, c.name, "-p", strconv.Itoa(c.port),
			"--start-conf=manual", "--", "--auth-local=trust", "--auth-host=trust").CombinedOutput()
		if err != nil {
			return fmt.Errorf("creating the private cluster failed (it needs root or the postgres user once: pg_createcluster %s %s -p %d --start-conf=manual -- --auth-local=trust --auth-host=trust): %w\n%s",
				c.version, c.name, c.port, err, out)
		}
	}
	if err := c.configure(); err != nil {
		return err
	}
	if running, _ := c.running(ctx); running {
		// Settings written above take effect at the restart the fault
		// schedule performs; pg_hba.conf is re-read at once.
		return c.ctl(ctx, "reload")
	}
	return c.ctl(ctx, "start")
}

// configure writes the settings and pg_hba.conf where they differ, so a
// cluster configured once runs without write access to /etc/postgresql.
func (c cluster) configure() error {
	dir := c.confDir()
	for _, f := range []struct {
		path, content string
		mode          os.FileMode
	}{
		{filepath.Join(dir, "conf.d", "zz-chaos.conf"), or(c.settings, clusterSettings), 0o644},
		{filepath.Join(dir, "pg_hba.conf"), or(c.hba, clusterHBA), 0o640},
	} {
		if old, err := os.ReadFile(f.path); err == nil && string(old) == f.content {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			return fmt.Errorf("private cluster config: %w", err)
		}
		if err := os.WriteFile(f.path, []byte(f.content), f.mode); err != nil {
			return fmt.Errorf("private cluster config %s (needs root or the postgres user once): %w", f.path, err)
		}
	}
	return nil
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// lookup reads pg_lsclusters: the cluster's port, if it exists.
func (c cluster) lookup(ctx context.Context) (port int, exists bool, err error) {
	out, err := exec.CommandContext(ctx, "pg_lsclusters", "--no-header").Output()
	if err != nil {
		return 0, false, fmt.Errorf("pg_lsclusters: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == c.version && f[1] == c.name {
			port, err := strconv.Atoi(f[2])
			return port, true, err
		}
	}
	return 0, false, nil
}

func (c cluster) running(ctx context.Context) (bool, error) {
	out, err := exec.CommandContext(ctx, "pg_lsclusters", "--no-header").Output()
	if err != nil {
		return false, fmt.Errorf("pg_lsclusters: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[0] == c.version && f[1] == c.name {
			return strings.HasPrefix(f[3], "online"), nil // "online,recovery" on a standby
		}
	}
	return false, nil
}

// ctl runs pg_ctlcluster action (start, stop, restart, reload) with the
// given pg_ctl shutdown mode options.
func (c cluster) ctl(ctx context.Context, action string, opts ...string) error {
	if err := c.safe(); err != nil {
		return err
	}
	args := append([]string{"--skip-systemctl-redirect"}, opts...)
	args = append(args, c.version, c.name, action)
	out, err := exec.CommandContext(ctx, "pg_ctlcluster", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctlcluster %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// restart restarts the cluster: mode "fast" (clean shutdown) or
// "immediate" (no shutdown checkpoint: recovery replays the WAL, as after
// a crash).
func (c cluster) restart(ctx context.Context, mode string) error {
	return c.ctl(ctx, "restart", "-m", mode)
}

// stop stops the cluster (fast mode); it is not dropped, so the next run
// starts it again.
func (c cluster) stop(ctx context.Context) error {
	if running, err := c.running(ctx); err == nil && !running {
		return nil
	}
	return c.ctl(ctx, "stop", "-m", "fast")
}

// waitReady polls db until it answers or ctx ends.
func waitReady(ctx context.Context, db *sql.DB, what string) error {
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		last = db.PingContext(pctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer: %w", what, errors.Join(ctx.Err(), last))
		case <-time.After(100 * time.Millisecond):
		}
	}
}
