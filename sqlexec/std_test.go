package sqlexec_test

import (
	"context"
	"database/sql"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// slowAccepter is a TCP proxy to upstream that accepts one connection
// every delay, as a postmaster behind a long accept queue does: the
// kernel completes each handshake at once, the server reads the start-up
// packet only later, also from a client that has gone.
type slowAccepter struct {
	ln       net.Listener
	accepted atomic.Int32
}

func newSlowAccepter(t *testing.T, upstream string, delay time.Duration) *slowAccepter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &slowAccepter{ln: ln}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			time.Sleep(delay)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
			wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return s
}

// TestStdGetsThroughAnAcceptSlowerThanTheDeadline runs the adapter on
// PostgreSQL behind a server that accepts a connection every 300 ms,
// with calls of 100 ms deadlines. Dialled on the calls' deadlines, every
// connection would be served after its caller left, and no call would
// ever get through (the livelock after a restart); through the gate a
// dial outlives its caller and serves a later call.
func TestStdGetsThroughAnAcceptSlowerThanTheDeadline(t *testing.T) {
	testenv.Postgres(t) // skips (or fails under CI) without PostgreSQL
	u, err := url.Parse(testenv.PostgresDSN())
	if err != nil || u.Host == "" {
		t.Skipf("POSTGRES_DSN is not a URL with a host: %v", err)
	}
	proxy := newSlowAccepter(t, u.Host, 300*time.Millisecond)
	u.Host = proxy.ln.Addr().String()
	db, err := sql.Open("pgx", u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(4)
	std := sqlexec.Std(db)

	var calls int
	var last error
	for start := time.Now(); time.Since(start) < 20*time.Second; calls++ {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, last = std.Exec(ctx, "SELECT 1")
		cancel()
		if last == nil {
			break
		}
	}
	require.NoError(t, last, "no call got through in 20 s (%d calls, %d connections accepted)", calls, proxy.accepted.Load())
	require.Less(t, int(proxy.accepted.Load()), calls,
		"the connects outlived their callers: fewer than one per call reached the server")
}

// BenchmarkStdExec runs SELECT 1 through the adapter from parallel
// callers, with contexts without a deadline (database/sql's own path)
// and with one (through the gate).
func BenchmarkStdExec(b *testing.B) {
	db := testenv.Postgres(b)
	std := sqlexec.Std(db)
	for _, bc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"no deadline", func() (context.Context, context.CancelFunc) { return context.WithCancel(b.Context()) }},
		{"deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(b.Context(), 10*time.Second) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx, cancel := bc.ctx()
					_, err := std.Exec(ctx, "SELECT 1")
					cancel()
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
