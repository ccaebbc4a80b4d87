package chaos

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync"
	"time"
)

// dialer is a database/sql connector whose dials outlive the call that
// needs a connection. database/sql dials on the caller's context, and a
// store call bounded by a short StoreTimeout (Lease/3) gives up on its
// dial long before a busy server's accept queue reaches it: the kernel
// has queued the connection, the postmaster still forks a backend for it
// and starts it up, and the caller has gone, so the queue fills with
// dead connections and every new dial waits behind them — a livelock
// that outlasts a restart or a terminate fault by minutes.
//
// A dialer dials with its own timeout instead, at most slots dials at a
// time. Connect still returns when its caller's context ends; the dial
// goes on, and the connection it yields waits for the pool's next
// Connect. The caller keeps its deadline, the server serves dead
// connections only for dials that outlived the timeout, and the accept
// queue never holds more than slots dials of each process. pgxpool does
// the same: its Acquire does not cancel a connection being dialled.
type dialer struct {
	connector driver.Connector
	timeout   time.Duration
	slots     chan struct{}    // one per dial in flight
	ready     chan driver.Conn // dials finished after their caller left
	// base is every dial's context: Close cancels the dials in flight.
	base  context.Context
	stop  context.CancelFunc
	dials sync.WaitGroup
	// mu guards closed and orders it with the sends to ready.
	mu     sync.Mutex
	closed bool
}

// newDialer dials through c, each dial bounded by timeout, at most slots
// at a time.
func newDialer(c driver.Connector, timeout time.Duration, slots int) *dialer {
	base, stop := context.WithCancel(context.Background())
	return &dialer{connector: c, timeout: timeout, slots: make(chan struct{}, slots), ready: make(chan driver.Conn, slots), base: base, stop: stop}
}

// errDialerClosed answers a Connect after Close.
var errDialerClosed = errors.New("chaos: dialer closed")

// Connect returns a connection dialled for an earlier caller that left,
// or dials one, waiting for a free slot. It returns ctx's error when ctx
// ends first; a dial it started goes on.
func (d *dialer) Connect(ctx context.Context) (driver.Conn, error) {
	select {
	case c := <-d.ready:
		return c, nil
	default:
	}
	select {
	case c := <-d.ready:
		return c, nil
	case d.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		<-d.slots
		return nil, errDialerClosed
	}
	d.dials.Add(1)
	d.mu.Unlock()
	type dialed struct {
		conn driver.Conn
		err  error
	}
	answer, left := make(chan dialed), make(chan struct{})
	go func() {
		defer d.dials.Done()
		defer func() { <-d.slots }()
		dctx, cancel := context.WithTimeout(d.base, d.timeout)
		conn, err := d.connector.Connect(dctx)
		cancel()
		select {
		case answer <- dialed{conn, err}:
		case <-left:
			if err == nil {
				d.keep(conn)
			}
		}
	}()
	select {
	case a := <-answer:
		return a.conn, a.err
	case <-ctx.Done():
		close(left)
		return nil, ctx.Err()
	}
}

// keep puts a connection whose caller left where the next Connect finds
// it, or closes it after Close or when slots connections wait already.
func (d *dialer) keep(c driver.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		select {
		case d.ready <- c:
			return
		default:
		}
	}
	_ = c.Close()
}

// Driver returns the wrapped connector's driver.
func (d *dialer) Driver() driver.Driver { return d.connector.Driver() }

// Close cancels the dials in flight, waits for them and closes the
// connections no caller took. sql.DB.Close calls it.
func (d *dialer) Close() error {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.stop()
	d.dials.Wait()
	for {
		select {
		case c := <-d.ready:
			_ = c.Close()
		default:
			return nil
		}
	}
}
