package sqlexec

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// database/sql dials a new connection on the context of the call that
// needs it, so a call's deadline cuts its connect short too. After a
// restart, or when every backend was terminated, a fleet redials at once;
// the kernel queues each connect until the server accepts it, and
// PostgreSQL forks and starts a backend for every queued connect in turn,
// also for one whose caller has gone. When the queue takes longer to
// drain than the callers' deadline (StoreTimeout, Lease/3 by default),
// every dial is dead by the time it is served, the callers retry with
// fresh dials, the queue stays full, and no call gets through: a livelock
// that outlasts the fault for as long as the callers keep calling.
//
// So a call whose context has a deadline takes its connection from a
// connGate instead: the acquisition (a free connection, or a dial) runs
// in a goroutine on a context of its own, the caller's without its
// cancellation and with a deadline of at least acquireTimeout, and the
// caller waits for it only until its own context ends. A connection that
// arrives after its caller left goes back to the pool, for the next call:
// no dial is wasted. At most maxAcquiring acquisitions of a gate are in
// flight; a caller waiting for one of those slots gives up at its deadline
// without starting anything, so a fleet cannot flood the server's accept
// queue with more than maxAcquiring connects per store. pgxpool behaves
// the same way: its Acquire does not cancel a connection being dialled.
//
// A call without a deadline (the transactional inbox's claim, a relay
// without timeouts) uses the pool directly: its dial ends only with the
// caller's cancellation, not after a fixed short time, and it pays for no
// goroutine.

const (
	// acquireTimeout bounds an acquisition its caller may have left: far
	// longer than a busy server takes to serve a few connects, shorter
	// than anyone waits for a dial to a server that does not answer. A
	// caller whose deadline is later keeps its own. A connect_timeout in
	// the DSN still bounds each dial.
	acquireTimeout = 10 * time.Second
	// maxAcquiring bounds a gate's acquisitions in flight: what one
	// store can put in the server's accept queue. With 8, six stores of
	// 12 connections came back from a mass termination as fast as
	// pgxpool did (about 1–2 s on two busy cores) with at most some 50
	// connects queued; with 4, in 1.6–3.5 s with 20 (-config storm of
	// the fault suite). PostgreSQL's backlog is about twice its
	// max_connections (244 by default).
	maxAcquiring = 8
	// badConnAttempts is how often a statement meets a connection found
	// dead before the statement was sent (driver.ErrBadConn) before its
	// error is returned: database/sql's own retries, kept for statements
	// run on a connection the gate handed out.
	badConnAttempts = 3
)

// connGate hands out the connections of one database/sql pool to calls
// bounded by a deadline. It is safe for concurrent use.
type connGate struct {
	db    *sql.DB
	slots chan struct{} // one per acquisition in flight
}

func newConnGate(db *sql.DB) *connGate {
	return &connGate{db: db, slots: make(chan struct{}, maxAcquiring)}
}

// gated reports whether a call on ctx takes its connection through a
// gate: whether its context has a deadline.
func gated(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok
}

// conn returns a connection of the pool, or ctx's error if ctx ends
// first; the acquisition then goes on and its connection goes back to
// the pool. The caller closes the connection it gets.
func (g *connGate) conn(ctx context.Context) (*sql.Conn, error) {
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, notSent{fmt.Errorf("waiting to acquire a connection: %w", ctx.Err())}
	}
	type acquired struct {
		conn *sql.Conn
		err  error
	}
	answer, left := make(chan acquired), make(chan struct{})
	deadline := time.Now().Add(acquireTimeout)
	if d, _ := ctx.Deadline(); d.After(deadline) {
		deadline = d
	}
	go func() {
		defer func() { <-g.slots }()
		actx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		conn, err := g.db.Conn(actx)
		cancel()
		select {
		case answer <- acquired{conn, err}:
		case <-left:
			if err == nil {
				_ = conn.Close()
			}
		}
	}()
	select {
	case a := <-answer:
		return a.conn, a.err
	case <-ctx.Done():
		close(left)
		return nil, notSent{fmt.Errorf("acquiring a connection: %w", ctx.Err())}
	}
}

// notSent is the error of a call that gave up before it had a
// connection: its statement never reached the database. Its
// StatementNotSent method tells the two-phase protocol that a claim
// failing so needs no release (internal/lease).
type notSent struct{ error }

func (e notSent) Unwrap() error { return e.error }

// StatementNotSent reports that the statement never reached the
// database.
func (notSent) StatementNotSent() bool { return true }

// exec runs a statement on a connection of the gate.
func (g *connGate) exec(ctx context.Context, query string, args ...any) (int64, error) {
	var err error
	for range badConnAttempts {
		var conn *sql.Conn
		if conn, err = g.conn(ctx); err != nil {
			return 0, err
		}
		var n int64
		n, err = stdExec{conn}.Exec(ctx, query, args...)
		_ = conn.Close()
		if !errors.Is(err, driver.ErrBadConn) {
			return n, err
		}
	}
	return 0, err
}

// queryRow runs a one-row query on a connection of the gate, which goes
// back to the pool once the row is scanned.
func (g *connGate) queryRow(ctx context.Context, query string, args ...any) Row {
	for i := 1; ; i++ {
		conn, err := g.conn(ctx)
		if err != nil {
			return errRow{err}
		}
		row := conn.QueryRowContext(ctx, query, args...)
		if err := row.Err(); err != nil {
			_ = conn.Close()
			if errors.Is(err, driver.ErrBadConn) && i < badConnAttempts {
				continue
			}
			return row
		}
		return connRow{row, conn}
	}
}

// query runs a query on a connection of the gate, which goes back to
// the pool when the rows are closed.
func (g *connGate) query(ctx context.Context, query string, args ...any) (Rows, error) {
	for i := 1; ; i++ {
		conn, err := g.conn(ctx)
		if err != nil {
			return nil, err
		}
		rows, err := conn.QueryContext(ctx, query, args...)
		if err != nil {
			_ = conn.Close()
			if errors.Is(err, driver.ErrBadConn) && i < badConnAttempts {
				continue
			}
			return nil, err
		}
		return connRows{rows, conn}, nil
	}
}

// begin begins a transaction on a connection of the gate. The caller
// ends the transaction, then closes the connection.
func (g *connGate) begin(ctx context.Context, opts *sql.TxOptions) (*sql.Conn, *sql.Tx, error) {
	for i := 1; ; i++ {
		conn, err := g.conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		tx, err := conn.BeginTx(ctx, opts)
		if err != nil {
			_ = conn.Close()
			if errors.Is(err, driver.ErrBadConn) && i < badConnAttempts {
				continue
			}
			return nil, nil, err
		}
		return conn, tx, nil
	}
}

// errRow is a row whose query never ran.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// connRow returns its connection to the pool once scanned.
type connRow struct {
	row  *sql.Row
	conn *sql.Conn
}

func (r connRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	_ = r.conn.Close()
	return err
}

// connRows returns its connection to the pool once closed.
type connRows struct {
	*sql.Rows
	conn *sql.Conn
}

func (r connRows) Close() error {
	err := r.Rows.Close()
	_ = r.conn.Close()
	return err
}
