package chaos

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// slowConnector dials once release is closed (or its context ends), and
// counts its dials in flight and the connections it made and closed.
type slowConnector struct {
	release  chan struct{}
	inFlight atomic.Int32
	most     atomic.Int32
	made     atomic.Int32
	closed   atomic.Int32
}

func (c *slowConnector) Connect(ctx context.Context) (driver.Conn, error) {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for {
		m := c.most.Load()
		if n <= m || c.most.CompareAndSwap(m, n) {
			break
		}
	}
	select {
	case <-c.release:
		c.made.Add(1)
		return &fakeConn{closed: &c.closed}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *slowConnector) Driver() driver.Driver { return nil }

type fakeConn struct {
	driver.Conn
	closed *atomic.Int32
}

func (f *fakeConn) Close() error { f.closed.Add(1); return nil }

func TestDialerHandsOverADialItsCallerLeft(t *testing.T) {
	c := &slowConnector{release: make(chan struct{})}
	d := newDialer(c, time.Minute, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := d.Connect(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller keeps its deadline")
	close(c.release)
	// The dial went on; the next caller gets its connection, no new dial.
	require.Eventually(t, func() bool { return len(d.ready) == 1 }, 5*time.Second, time.Millisecond)
	conn, err := d.Connect(context.Background())
	require.NoError(t, err)
	require.NotNil(t, conn)
	require.EqualValues(t, 1, c.made.Load())
	require.NoError(t, d.Close())
	require.Zero(t, c.closed.Load(), "the connection handed over is the pool's, not the dialer's")
}

func TestDialerBoundsDialsInFlight(t *testing.T) {
	c := &slowConnector{release: make(chan struct{})}
	d := newDialer(c, time.Minute, 3)
	var wg sync.WaitGroup
	conns := make(chan driver.Conn, 10)
	for range 10 {
		wg.Go(func() {
			if conn, err := d.Connect(context.Background()); err == nil {
				conns <- conn
			}
		})
	}
	require.Eventually(t, func() bool { return c.inFlight.Load() == 3 }, 5*time.Second, time.Millisecond)
	close(c.release)
	wg.Wait()
	require.Len(t, conns, 10)
	require.EqualValues(t, 3, c.most.Load(), "at most slots dials at a time")
	require.NoError(t, d.Close())
}

// leave makes a Connect whose caller gives up at once.
func leave(t *testing.T, d *dialer) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := d.Connect(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestDialerCloseClosesWhatNoCallerTook(t *testing.T) {
	c := &slowConnector{release: make(chan struct{})}
	d := newDialer(c, time.Minute, 2)
	leave(t, d)
	close(c.release)
	require.Eventually(t, func() bool { return len(d.ready) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, d.Close())
	require.EqualValues(t, 1, c.closed.Load())
}

func TestDialerCloseCancelsDialsInFlight(t *testing.T) {
	c := &slowConnector{release: make(chan struct{})}
	d := newDialer(c, time.Minute, 2)
	leave(t, d)
	require.Eventually(t, func() bool { return c.inFlight.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, d.Close(), "Close returns without waiting for the dial's timeout")
	require.Zero(t, c.inFlight.Load())
	_, err := d.Connect(context.Background())
	require.ErrorIs(t, err, errDialerClosed)
}

func TestDialerTimeout(t *testing.T) {
	c := &slowConnector{release: make(chan struct{})}
	d := newDialer(c, 20*time.Millisecond, 1)
	defer d.Close()
	_, err := d.Connect(context.Background())
	require.ErrorIs(t, err, context.DeadlineExceeded, "a dial ends at the dialer's timeout, whatever its caller's deadline")
}

// slowAccepter is a TCP proxy to addr that accepts each connection
// delay after the previous one, as a postmaster behind a long accept
// queue would: the kernel completes the handshake at once, the server
// reads the start-up packet only later.
type slowAccepter struct {
	ln       net.Listener
	accepted atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newSlowAccepter(t *testing.T, addr string, delay time.Duration) *slowAccepter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &slowAccepter{ln: ln}
	s.wg.Go(func() {
		for {
			time.Sleep(delay)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			up, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			s.mu.Lock()
			s.conns = append(s.conns, c, up)
			s.mu.Unlock()
			s.wg.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
			s.wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// TestOpenDBDialsOutsideTheCallsDeadline runs openDB's pgx pool through
// a server slower to accept than the calls' deadline: without a dial
// timeout every ping gives up on its dial, which the server serves all
// the same; with one, the dial outlives its ping and the next caller
// gets its connection.
func TestOpenDBDialsOutsideTheCallsDeadline(t *testing.T) {
	addr := cmp.Or(os.Getenv("POSTGRES_ADDR"), "127.0.0.1:5432")
	if c, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
		t.Skipf("PostgreSQL at %s not available: %v", addr, err)
	} else {
		_ = c.Close()
	}
	ping := func(db *sql.DB, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		return db.PingContext(ctx)
	}
	dsn := func(s *slowAccepter) string {
		return "postgres://postgres@" + s.ln.Addr().String() + "/test?sslmode=disable&application_name=chaos-dialer-test"
	}

	plain := newSlowAccepter(t, addr, 200*time.Millisecond)
	db, err := openDB(dsn(plain), 1, 0)
	require.NoError(t, err)
	defer db.Close()
	for range 3 {
		require.Error(t, ping(db, 50*time.Millisecond))
	}
	require.Eventually(t, func() bool { return plain.accepted.Load() == 3 }, 10*time.Second, 10*time.Millisecond,
		"the server serves every dial, each for a caller that left")

	slow := newSlowAccepter(t, addr, 200*time.Millisecond)
	db, err = openDB(dsn(slow), 1, 10*time.Second)
	require.NoError(t, err)
	defer db.Close()
	require.Error(t, ping(db, 50*time.Millisecond), "the caller keeps its deadline")
	require.NoError(t, ping(db, 5*time.Second))
	require.EqualValues(t, 1, slow.accepted.Load(), "one dial, served once, used by the next caller")
}
