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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a private redis-server process for fault tests: it keeps
// its files in a temporary directory of the test, listens on a port of
// its own (never the shared 6379), and can be killed and started again on
// the same port and files. It is stopped when the test ends.
type RedisServer struct {
	// Addr is host:port of the server.
	Addr string

	t       testing.TB
	args    []string
	logFile string
	cmd     *exec.Cmd
	done    chan struct{}
}

// StartRedisServer starts redis-server with the given configuration
// directives (for example "--appendonly", "yes"), after --port, --bind,
// --dir, --logfile (see Log) and --save "" (no RDB snapshots unless args
// set "--save"). Without a redis-server binary the test is skipped, or
// fails under CI=true.
func StartRedisServer(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Missing(t, "redis-server binary (for a private Redis)", err)
	}
	port, err := freePort(slices.Contains(args, "--cluster-enabled"))
	if err != nil {
		t.Fatalf("private redis: %v", err)
	}
	dir := t.TempDir()
	s := &RedisServer{
		Addr:    net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		t:       t,
		logFile: filepath.Join(dir, "redis.log"),
	}
	s.args = append([]string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--logfile", s.logFile,
		"--save", "", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"}, args...)
	t.Cleanup(s.Kill)
	s.Start()
	return s
}

// Start starts the server (again) and waits until it answers PING.
func (s *RedisServer) Start() {
	s.t.Helper()
	s.cmd = exec.Command(s.args[0], s.args[1:]...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("private redis: %v", err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.done)
	client := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer client.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := client.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-s.done:
			s.t.Fatalf("private redis on %s exited at start: %v; its log:\n%s", s.Addr, err, s.Log())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("private redis on %s does not answer: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill ends the server with SIGKILL — a crash: nothing is flushed or
// saved on the way out — and waits for it to exit.
func (s *RedisServer) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Log returns what the server has logged so far — warnings and worse
// (--loglevel warning), among them every step of a cluster failover —
// for a failing test to show.
func (s *RedisServer) Log() string {
	b, err := os.ReadFile(s.logFile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// Client returns a client of the server, closed when the test ends.
func (s *RedisServer) Client() *redis.Client {
	client := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.t.Cleanup(func() { _ = client.Close() })
	return client
}

// clusterBusOffset is how far above its port a cluster node listens for
// the cluster bus.
const clusterBusOffset = 10000

// freePort returns a TCP port that was free a moment ago. The kernel
// hands out ephemeral ports, far from the shared services' ports. With
// bus, the port's cluster bus port is a valid port and was free too: an
// ephemeral port above 55535 has none, and redis-server refuses it.
func freePort(bus bool) (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := !bus
		if bus && port+clusterBusOffset <= 65535 {
			if bl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+clusterBusOffset))); err == nil {
				_ = bl.Close()
				ok = true
			}
		}
		_ = l.Close()
		if ok {
			return port, nil
		}
	}
	return 0, errors.New("free port: none with a free cluster bus port in 100 tries")
}
