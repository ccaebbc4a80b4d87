package main

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// echoServer accepts connections on loopback and writes back whatever it
// reads, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// sleeps records the delays a roundTrips asks for, without sleeping.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) sleep(d time.Duration) { s.mu.Lock(); s.d = append(s.d, d); s.mu.Unlock() }

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

func dialTest(t *testing.T, rt *roundTrips, addr string) net.Conn {
	t.Helper()
	c, err := rt.dial(context.Background(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

func readN(t *testing.T, c net.Conn, n int) {
	t.Helper()
	if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
}

// TestRoundTripsCountAndDelay: writes sent together before an answer is
// read are one round trip, a write after an answer starts the next, and
// each round trip is delayed once, by rtt.
func TestRoundTripsCountAndDelay(t *testing.T) {
	addr := echoServer(t)
	var s sleeps
	rt := &roundTrips{rtt: 300 * time.Microsecond, sleep: s.sleep}
	c := dialTest(t, rt, addr)

	write(t, c, "a") // a pipeline: three writes, one answer
	write(t, c, "b")
	write(t, c, "c")
	readN(t, c, 3)
	write(t, c, "d") // a statement that waits for its answer
	readN(t, c, 1)
	write(t, c, "e")
	readN(t, c, 1)

	if got := rt.load(); got != 3 {
		t.Errorf("round trips: got %d, want 3", got)
	}
	got := s.all()
	if len(got) != 3 {
		t.Fatalf("delays: got %d (%v), want 3, one per round trip", len(got), got)
	}
	for i, d := range got {
		if d != 300*time.Microsecond {
			t.Errorf("delay %d: got %s, want the -rtt 300µs", i, d)
		}
	}
	if n := rt.delays.Load(); n != 3 {
		t.Errorf("delays recorded for the mean: got %d, want 3", n)
	}
}

// TestRoundTripsNoDelayAtZero: without -rtt round trips are counted and
// nothing sleeps.
func TestRoundTripsNoDelayAtZero(t *testing.T) {
	addr := echoServer(t)
	var s sleeps
	rt := &roundTrips{sleep: s.sleep}
	c := dialTest(t, rt, addr)
	for range 4 {
		write(t, c, "x")
		readN(t, c, 1)
	}
	if got := rt.load(); got != 4 {
		t.Errorf("round trips: got %d, want 4", got)
	}
	if got := s.all(); len(got) != 0 {
		t.Errorf("slept %v with rtt 0", got)
	}
	if d := rt.meanDelay(); d != 0 {
		t.Errorf("mean delay: got %s, want 0", d)
	}
}

// TestRoundTripsDelaysDoNotSerialize: two connections of one counter
// wait out their delays at the same time; neither waits for the other.
func TestRoundTripsDelaysDoNotSerialize(t *testing.T) {
	addr := echoServer(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	rt := &roundTrips{rtt: time.Millisecond, sleep: func(time.Duration) {
		entered <- struct{}{}
		<-release
	}}
	conns := []net.Conn{dialTest(t, rt, addr), dialTest(t, rt, addr)}
	errs := make(chan error, len(conns))
	for _, c := range conns {
		go func() {
			if _, err := c.Write([]byte("x")); err != nil {
				errs <- err
				return
			}
			_, err := io.ReadFull(c, make([]byte, 1))
			errs <- err
		}()
	}
	// Both writers are inside their delay before either is released:
	// a shared lock would keep the second out until the first returned.
	for range conns {
		select {
		case <-entered:
		case <-time.After(10 * time.Second):
			t.Fatal("a connection's delay did not start while the other's was under way")
		}
	}
	close(release)
	for range conns {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := rt.load(); got != 2 {
		t.Errorf("round trips: got %d, want 2", got)
	}
}

// TestDelayProxy: a client dialing the proxy itself (as pgbench does) has
// its round trips counted and delayed on the way to the server, and gets
// the server's answers.
func TestDelayProxy(t *testing.T) {
	addr := echoServer(t)
	var s sleeps
	rt := &roundTrips{rtt: 500 * time.Microsecond, sleep: s.sleep}
	p, err := startProxy(rt, addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"BEGIN", "INSERT", "COMMIT"} {
		write(t, c, msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if string(got) != msg {
			t.Fatalf("through the proxy: got %q, want %q", got, msg)
		}
	}
	if got := rt.load(); got != 3 {
		t.Errorf("round trips: got %d, want 3", got)
	}
	if got := s.all(); len(got) != 3 {
		t.Errorf("delays: got %d, want 3", len(got))
	}
	_ = c.Close()
	if err := p.close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

func TestDSNWithAddr(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres@127.0.0.1:6000/test?sslmode=disable"},
		{"host=db port=5432 dbname=test", "host=db port=5432 dbname=test host=127.0.0.1 port=6000"},
	} {
		got, err := dsnWithAddr(tc.dsn, "127.0.0.1:6000")
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("dsnWithAddr(%q): got %q, want %q", tc.dsn, got, tc.want)
		}
	}
}
