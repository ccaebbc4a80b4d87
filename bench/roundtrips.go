package main

import (
	"context"
	"net"
	"sync/atomic"
)

// roundTrips counts round trips on the connections it dials, on the
// wire rather than by reasoning: a write that follows a read (or opens
// the connection's traffic) starts one, so statements a driver sends
// together (a pipeline, a multi-statement query, a prepare and its
// execute written at once) count once, and a statement that waits for
// its answer counts once. The harness gives each database its own
// counter and reads it around a run's deliveries.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) load() int64 {
	if r == nil {
		return 0
	}
	return r.n.Load()
}

// dial opens a TCP connection whose traffic r counts.
func (r *roundTrips) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cc := &countedConn{Conn: c, r: r}
	cc.answered.Store(true)
	return cc, nil
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
