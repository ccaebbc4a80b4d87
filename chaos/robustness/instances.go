package robustness

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	goredis "github.com/redis/go-redis/v9"
)

// ErrMissing means a service or tool a backend needs is not available.
var ErrMissing = errors.New("robustness: prerequisite missing")

// Fault is something done to a backend while clients use it. Inject
// returns once the backend answers again.
type Fault struct {
	Name   string
	Inject func(ctx context.Context) error
}

// Ports of the private servers. The shared services (PostgreSQL 5432,
// MariaDB 3306, Redis 6379) are never stopped, restarted or killed; on
// MariaDB the suite only kills its own connections.
const (
	postgresPort = 5460
	redisPort    = 6390
	redisAOFPort = 6391 // and 6400 for redis-aof-noretry
)

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func tempDir(b *Backend) (string, error) {
	dir, err := os.MkdirTemp("", "robust-"+b.Name+"-")
	if err == nil {
		b.closes = append(b.closes, func() { _ = os.RemoveAll(dir) })
	}
	return dir, err
}

// waitFor polls ping every 50ms until it succeeds or 30s pass.
func waitFor(ctx context.Context, what string, ping func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		err := ping(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not answer: %w", what, errors.Join(ctx.Err(), err))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// privatePostgres is a cluster of the suite's own (Debian's
// postgresql-common), created for the run and dropped after it.
type privatePostgres struct {
	version, name string
	store, admin  *sql.DB
}

func startPostgres(ctx context.Context, b *Backend) (*privatePostgres, error) {
	for _, tool := range []string{"pg_createcluster", "pg_ctlcluster", "pg_dropcluster"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%w: %s (postgresql-common): %v", ErrMissing, tool, err)
		}
	}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(versions) == 0 {
		return nil, fmt.Errorf("%w: no PostgreSQL server under /usr/lib/postgresql", ErrMissing)
	}
	pg := &privatePostgres{version: filepath.Base(filepath.Dir(filepath.Dir(versions[len(versions)-1]))), name: "robust"}
	// A cluster left by an interrupted run is dropped first.
	_ = exec.CommandContext(ctx, "pg_dropcluster", "--stop", pg.version, pg.name).Run()
	out, err := exec.CommandContext(ctx, "pg_createcluster", pg.version, pg.name, "-p", strconv.Itoa(postgresPort),
		"--start-conf=manual", "--start", "--", "--auth-local=trust", "--auth-host=trust").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("pg_createcluster %s %s -p %d (needs root or the postgres user): %w\n%s", pg.version, pg.name, postgresPort, err, out)
	}
	b.closes = append(b.closes, func() {
		_ = exec.Command("pg_dropcluster", "--stop", pg.version, pg.name).Run()
		_ = os.Remove(filepath.Join("/var/run/postgresql", pg.version+"-"+pg.name+".pid"))
	})
	dsn := func(app string) string {
		return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&application_name=%s&connect_timeout=5", postgresPort, app)
	}
	if pg.store, err = sql.Open("pgx", dsn("robust-store")); err != nil {
		return nil, err
	}
	b.closes = append(b.closes, func() { _ = pg.store.Close() })
	if pg.admin, err = sql.Open("pgx", dsn("robust-admin")); err != nil {
		return nil, err
	}
	b.closes = append(b.closes, func() { _ = pg.admin.Close() })
	return pg, waitFor(ctx, "private PostgreSQL", pg.store.PingContext)
}

func (pg *privatePostgres) faults() []Fault {
	return []Fault{
		{Name: "pg_terminate_backend", Inject: func(ctx context.Context) error {
			_, err := pg.admin.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'robust-store'`)
			return err
		}},
		{Name: "restart (immediate)", Inject: func(ctx context.Context) error {
			if out, err := exec.CommandContext(ctx, "pg_ctlcluster", "--skip-systemctl-redirect", "-m", "immediate",
				pg.version, pg.name, "restart").CombinedOutput(); err != nil {
				return fmt.Errorf("pg_ctlcluster restart: %w\n%s", err, out)
			}
			return waitFor(ctx, "private PostgreSQL", pg.admin.PingContext)
		}},
		{Name: "kill -9 (postmaster and backends)", Inject: pg.kill},
	}
}

// kill SIGKILLs the cluster's postmaster and every process it started,
// as a machine crash would end them, then starts the cluster again
// (crash recovery replays the WAL).
func (pg *privatePostgres) kill(ctx context.Context) error {
	pidFile := filepath.Join("/var/lib/postgresql", pg.version, pg.name, "postmaster.pid")
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]))
	if err != nil {
		return fmt.Errorf("%s: %w", pidFile, err)
	}
	children := childrenOf(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	for _, p := range append(children, pid) {
		if err := waitFor(ctx, "the end of process "+strconv.Itoa(p), func(context.Context) error {
			if gone(p) {
				return nil
			}
			return errors.New("still running")
		}); err != nil {
			return err
		}
	}
	if out, err := exec.CommandContext(ctx, "pg_ctlcluster", "--skip-systemctl-redirect", pg.version, pg.name, "start").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctlcluster start: %w\n%s", err, out)
	}
	return waitFor(ctx, "private PostgreSQL", pg.admin.PingContext)
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, s := range stats {
		data, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may contain spaces and parentheses.
		rest := string(data)[strings.LastIndexByte(string(data), ')')+1:]
		f := strings.Fields(rest)
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if c, err := strconv.Atoi(filepath.Base(filepath.Dir(s))); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// gone reports whether pid has exited and been reaped: PostgreSQL
// refuses to start while the PID in its lock file exists, even as a
// zombie.
func gone(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err != nil
}

// sharedMariaDB is a database of the suite's own on the shared MariaDB
// (MYSQL_DSN, default root@tcp(127.0.0.1:3306)/test), dropped after the
// run. The server itself is shared, so the only fault is killing the
// suite's own connections.
type sharedMariaDB struct {
	db           string
	store, admin *sql.DB
}

func openMariaDB(ctx context.Context, b *Backend) (*sharedMariaDB, error) {
	dsn := os.Getenv("MYSQL_DSN")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC"
	}
	// The driver logs every connection the KILL fault ends; the history
	// records what the store answered, which is what matters here.
	_ = gomysql.SetLogger(log.New(io.Discard, "", 0))
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("MYSQL_DSN: %w", err)
	}
	my := &sharedMariaDB{db: "robust_" + randomHex()}
	cfg.DBName = ""
	if my.admin, err = sql.Open("mysql", cfg.FormatDSN()); err != nil {
		return nil, err
	}
	b.closes = append(b.closes, func() { _ = my.admin.Close() })
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := my.admin.PingContext(pctx); err != nil {
		return nil, fmt.Errorf("%w: MariaDB (MYSQL_DSN): %v", ErrMissing, err)
	}
	if _, err := my.admin.ExecContext(ctx, "CREATE DATABASE "+my.db); err != nil {
		return nil, err
	}
	b.closes = append(b.closes, func() { _, _ = my.admin.Exec("DROP DATABASE IF EXISTS " + my.db) })
	cfg.DBName = my.db
	if my.store, err = sql.Open("mysql", cfg.FormatDSN()); err != nil {
		return nil, err
	}
	b.closes = append(b.closes, func() { _ = my.store.Close() })
	return my, nil
}

func (my *sharedMariaDB) faults() []Fault {
	return []Fault{{Name: "KILL (own connections)", Inject: func(ctx context.Context) error {
		rows, err := my.admin.QueryContext(ctx, `SELECT id FROM information_schema.processlist WHERE db = ? AND id <> CONNECTION_ID()`, my.db)
		if err != nil {
			return err
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		for _, id := range ids {
			// A connection that ended meanwhile is no error.
			_, _ = my.admin.ExecContext(ctx, "KILL "+strconv.FormatInt(id, 10))
		}
		return nil
	}}}
}

// redisRestart is the fault that kills a private Redis and starts it again.
const redisRestart = "kill -9 and restart"

// privateRedis is a redis-server of the suite's own, without
// persistence or with an fsync'd append-only file.
type privateRedis struct {
	addr string
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

func startRedis(ctx context.Context, b *Backend, aof bool) (*privateRedis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: redis-server: %v", ErrMissing, err)
	}
	dir, err := tempDir(b)
	if err != nil {
		return nil, err
	}
	port := redisPort
	args := []string{"--save", ""}
	if aof {
		port = redisAOFPort + len(b.Name) - len("redis-aof") // redis-aof-noretry has a server of its own
		args = []string{"--save", "", "--appendonly", "yes", "--appendfsync", "always"}
	}
	rs := &privateRedis{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	rs.args = append([]string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning", "--logfile", filepath.Join(dir, "redis.log")}, args...)
	b.closes = append(b.closes, rs.stop)
	return rs, rs.start(ctx)
}

func (rs *privateRedis) start(ctx context.Context) error {
	rs.cmd = exec.Command(rs.args[0], rs.args[1:]...)
	if err := rs.cmd.Start(); err != nil {
		return err
	}
	rs.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(rs.cmd, rs.done)
	client := goredis.NewClient(&goredis.Options{Addr: rs.addr, MaxRetries: -1})
	defer client.Close()
	return waitFor(ctx, "private Redis on "+rs.addr, func(ctx context.Context) error {
		select {
		case <-rs.done:
			return errors.New("redis-server exited (is the port free?)")
		default:
		}
		return client.Ping(ctx).Err()
	})
}

// stop SIGKILLs the server and waits for it to exit.
func (rs *privateRedis) stop() {
	if rs.cmd == nil || rs.cmd.Process == nil {
		return
	}
	_ = rs.cmd.Process.Kill()
	<-rs.done
}

func (rs *privateRedis) faults() []Fault {
	return []Fault{
		{Name: "CLIENT KILL (connections)", Inject: func(ctx context.Context) error {
			admin := goredis.NewClient(&goredis.Options{Addr: rs.addr})
			defer admin.Close()
			return admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err()
		}},
		{Name: redisRestart, Inject: func(ctx context.Context) error {
			rs.stop()
			return rs.start(ctx)
		}},
	}
}
