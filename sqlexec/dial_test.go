package sqlexec

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// connector is a database/sql driver whose dials finish once release is
// closed (or their context ends). It counts dials in flight, the most
// at once, the connections made and closed, and the dials whose context
// ended first.
type connector struct {
	release   chan struct{}
	inFlight  atomic.Int32
	most      atomic.Int32
	made      atomic.Int32
	closed    atomic.Int32
	cancelled atomic.Int32
	// bad, when set, makes the next connection's first statement report
	// driver.ErrBadConn (found dead before anything was sent).
	bad atomic.Bool
}

func newConnector() *connector { return &connector{release: make(chan struct{})} }

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	select {
	case <-c.release:
		c.made.Add(1)
		conn := &conn{c: c}
		conn.bad.Store(c.bad.Swap(false))
		return conn, nil
	case <-ctx.Done():
		c.cancelled.Add(1)
		return nil, ctx.Err()
	}
}

func (c *connector) Driver() driver.Driver { return nil }

type conn struct {
	c   *connector
	bad atomic.Bool
}

func (f *conn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("fake: no prepared statements")
}
func (f *conn) Close() error              { f.c.closed.Add(1); return nil }
func (f *conn) Begin() (driver.Tx, error) { return tx{}, nil }

func (f *conn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	if f.bad.Swap(false) {
		return nil, driver.ErrBadConn
	}
	return tx{}, nil
}

func (f *conn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	if f.bad.Swap(false) {
		return nil, driver.ErrBadConn
	}
	return driver.RowsAffected(1), nil
}

func (f *conn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	if f.bad.Swap(false) {
		return nil, driver.ErrBadConn
	}
	return &rows{}, nil
}

type tx struct{}

func (tx) Commit() error   { return nil }
func (tx) Rollback() error { return nil }

// rows is one row of one column, 42.
type rows struct{ done bool }

func (r *rows) Columns() []string { return []string{"n"} }
func (r *rows) Close() error      { return nil }
func (r *rows) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done, dest[0] = true, int64(42)
	return nil
}

// open returns a pool on c, its adapter, and a cleanup that lets every
// dial finish and closes the pool.
func open(t *testing.T, c *connector) (*sql.DB, DB) {
	db := sql.OpenDB(c)
	t.Cleanup(func() {
		select {
		case <-c.release:
		default:
			close(c.release)
		}
		require.Eventually(t, func() bool { return c.inFlight.Load() == 0 }, 10*time.Second, time.Millisecond)
		require.NoError(t, db.Close())
	})
	return db, Std(db)
}

func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestGateHandsADialItsCallerLeftToTheNextCall(t *testing.T) {
	c := newConnector()
	db, std := open(t, c)
	_, err := std.Exec(within(t, 20*time.Millisecond), "UPDATE")
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller keeps its deadline")
	require.Zero(t, c.cancelled.Load())
	close(c.release)
	// The dial went on; its connection went back to the pool.
	require.Eventually(t, func() bool { return db.Stats().Idle == 1 }, 10*time.Second, time.Millisecond)
	n, err := std.Exec(within(t, 10*time.Second), "UPDATE")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.EqualValues(t, 1, c.made.Load(), "the next call took the connection dialled for the caller that left")
	require.Zero(t, c.closed.Load())
	require.Zero(t, db.Stats().InUse)
}

func TestGateBoundsAcquisitionsInFlight(t *testing.T) {
	c := newConnector()
	db, std := open(t, c)
	const calls = 3 * maxAcquiring
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for range calls {
		wg.Go(func() {
			_, err := std.Exec(within(t, time.Minute), "UPDATE")
			errs <- err
		})
	}
	require.Eventually(t, func() bool { return c.inFlight.Load() == maxAcquiring }, 10*time.Second, time.Millisecond)
	// A call waiting for a slot gives up at its deadline and dials
	// nothing.
	_, err := std.Exec(within(t, 20*time.Millisecond), "UPDATE")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(c.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, maxAcquiring, c.most.Load(), "at most maxAcquiring dials at a time")
	require.Zero(t, c.cancelled.Load())
	require.Zero(t, db.Stats().InUse)
}

func TestCallsWithoutDeadlineDialOnTheirContext(t *testing.T) {
	c := newConnector()
	_, std := open(t, c)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() {
		_, err := std.Exec(ctx, "UPDATE")
		done <- err
	}()
	require.Eventually(t, func() bool { return c.inFlight.Load() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.Eventually(t, func() bool { return c.cancelled.Load() == 1 }, 10*time.Second, time.Millisecond,
		"the dial ended with its caller: database/sql's own path")
}

func TestGateRetriesAConnectionFoundDead(t *testing.T) {
	c := newConnector()
	close(c.release)
	db, std := open(t, c)
	for _, call := range []struct {
		name string
		run  func(context.Context) error
	}{
		{"exec", func(ctx context.Context) error { _, err := std.Exec(ctx, "UPDATE"); return err }},
		{"query row", func(ctx context.Context) error {
			var n int
			return std.QueryRow(ctx, "SELECT").Scan(&n)
		}},
		{"query", func(ctx context.Context) error {
			rows, err := std.Query(ctx, "SELECT")
			if err != nil {
				return err
			}
			return rows.Close()
		}},
		{"transaction", func(ctx context.Context) error {
			return std.InTx(ctx, false, func(Executor) error { return nil })
		}},
	} {
		made := c.made.Load()
		c.bad.Store(true)
		db.SetMaxIdleConns(0) // every call dials, so the next connection is the bad one
		require.NoError(t, call.run(within(t, 10*time.Second)), call.name)
		require.Equal(t, made+2, c.made.Load(), "%s: a second connection after the dead one", call.name)
		require.Equal(t, c.made.Load(), c.closed.Load(), "%s: the dead connection is closed", call.name)
		db.SetMaxIdleConns(2)
	}
}

func TestGateReturnsConnectionsToThePool(t *testing.T) {
	c := newConnector()
	close(c.release)
	db, std := open(t, c)
	ctx := within(t, 10*time.Second)

	var n int
	require.NoError(t, std.QueryRow(ctx, "SELECT").Scan(&n))
	require.Equal(t, 42, n)
	require.Zero(t, db.Stats().InUse, "a scanned row gives its connection back")

	rows, err := std.Query(ctx, "SELECT")
	require.NoError(t, err)
	require.Equal(t, 1, db.Stats().InUse, "open rows hold their connection")
	require.True(t, rows.Next())
	require.NoError(t, rows.Scan(&n))
	require.NoError(t, rows.Close())
	require.Zero(t, db.Stats().InUse, "closed rows give their connection back")

	require.NoError(t, std.InTx(ctx, true, func(ex Executor) error {
		require.Equal(t, 1, db.Stats().InUse)
		_, err := ex.Exec(ctx, "UPDATE")
		return err
	}))
	boom := errors.New("boom")
	require.ErrorIs(t, std.InTx(ctx, false, func(Executor) error { return boom }), boom)
	require.NoError(t, std.OnSession(ctx, func(ex Executor) error {
		require.Equal(t, 1, db.Stats().InUse)
		return nil
	}))
	require.Zero(t, db.Stats().InUse, "transactions and sessions give their connection back")
	require.EqualValues(t, 1, c.made.Load(), "one connection served every call")
}

func TestGateGivesUpOnAClosedPool(t *testing.T) {
	c := newConnector()
	close(c.release)
	db, std := open(t, c)
	require.NoError(t, db.Close())
	_, err := std.Exec(within(t, 10*time.Second), "UPDATE")
	require.ErrorContains(t, err, "database is closed")
}
