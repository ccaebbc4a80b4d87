package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// roundTrips counts round trips on the connections it dials, on the
// wire rather than by reasoning: a write that follows a read (or opens
// the connection's traffic) starts one, so statements a driver sends
// together (a pipeline, a multi-statement query, a prepare and its
// execute written at once) count once, and a statement that waits for
// its answer counts once. The harness gives each database its own
// counter and reads it around a run's deliveries.
//
// With rtt set (-rtt) it also plays a network: the write that starts a
// round trip waits rtt before it goes out, so every round trip costs
// what it would across a network rather than over loopback. The wait is
// the writing goroutine's own, on its own connection: connections do not
// wait for one another.
type roundTrips struct {
	n atomic.Int64
	// rtt is the delay added to every round trip; 0 adds none.
	rtt time.Duration
	// sleep waits out rtt; nil is sleepRTT.
	sleep func(time.Duration)
	// slept is the time (ns) the delays actually took, sleep's
	// overshoot included.
	slept atomic.Int64
	// delays is how many round trips were delayed.
	delays atomic.Int64
}

func (r *roundTrips) load() int64 {
	if r == nil {
		return 0
	}
	return r.n.Load()
}

// meanDelay is the mean time a delayed round trip actually waited, 0 if
// none was.
func (r *roundTrips) meanDelay() time.Duration {
	if r == nil || r.delays.Load() == 0 {
		return 0
	}
	return time.Duration(r.slept.Load() / r.delays.Load())
}

// dial opens a TCP connection whose traffic r counts (and delays).
func (r *roundTrips) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return r.wrap(c), nil
}

// wrap counts (and delays) c's round trips.
func (r *roundTrips) wrap(c net.Conn) net.Conn {
	cc := &countedConn{Conn: c, r: r}
	cc.answered.Store(true)
	return cc
}

type countedConn struct {
	net.Conn
	r *roundTrips
	// answered: bytes arrived since the last write, so the next write
	// starts a new round trip.
	answered atomic.Bool
}

func (c *countedConn) Write(b []byte) (int, error) {
	if c.answered.Swap(false) {
		c.r.n.Add(1)
		c.r.delay()
	}
	return c.Conn.Write(b)
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.answered.Store(true)
	}
	return n, err
}

// delay waits out one round trip's rtt, if any.
func (r *roundTrips) delay() {
	if r.rtt <= 0 {
		return
	}
	sleep := r.sleep
	if sleep == nil {
		sleep = sleepRTT
	}
	start := time.Now()
	sleep(r.rtt)
	r.slept.Add(int64(time.Since(start)))
	r.delays.Add(1)
}

// meanDelays lists the mean delay of each counter that delayed anything,
// by name, in name order.
func meanDelays(byName map[string]*roundTrips) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		if d := byName[name].meanDelay(); d > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", name, d.Round(time.Microsecond)))
		}
	}
	if parts == nil {
		return "none delayed"
	}
	return strings.Join(parts, ", ")
}
