// Package sqlexec is the little the SQL stores need of a database driver:
// run one statement (Executor), and on the pool they own, a transaction
// or a session (DB). The stores of repository/postgres, mysql and sqlite
// run on it, so any driver fits behind a small adapter: Std and StdTx
// for database/sql, package pgxexec for pgx/v5.
//
//	repo, _ := postgres.NewPgxRepository(pool, postgres.Config{})
//	n, err := pgxexec.Exec(tx).Exec(ctx, query, args...) // tx: a pgx.Tx
//
// It is a leaf: it imports only the standard library.
package sqlexec

import (
	"context"
	"database/sql"
	"fmt"
)

// Executor runs one statement: what a store needs of a connection, pool
// or transaction. Row.Scan reports no row with an error wrapping
// sql.ErrNoRows (pgx's ErrNoRows does).
type Executor interface {
	Exec(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)
	QueryRow(ctx context.Context, query string, args ...any) Row
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Row is one row of a query's result; *sql.Row satisfies it.
type Row interface{ Scan(dest ...any) error }

// Rows is a query's result; *sql.Rows satisfies it.
type Rows interface {
	Row
	Next() bool
	Err() error
	Close() error
}

// DB is the pool a store owns.
//
// The database/sql adapter (Std) runs a call whose context has a
// deadline on a connection acquired outside that deadline (see
// dial.go): a connect its caller gave up on serves the next call instead
// of a caller that left, so a fleet of short deadlines cannot lock itself
// out of a server that restarted.
type DB interface {
	Executor
	// InTx runs fn in a transaction, committing if it returns nil and
	// rolling back otherwise; readCommitted asks for READ COMMITTED.
	InTx(ctx context.Context, readCommitted bool, fn func(Executor) error) error
	// OnSession runs fn on one connection, outside a transaction (for
	// session-level locks).
	OnSession(ctx context.Context, fn func(Executor) error) error
}

// Querier is what a database/sql transaction or connection offers:
// *sql.Tx, *sql.Conn and *sql.DB satisfy it (and repository.Querier is
// the same interface).
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Std adapts a database/sql pool; nil stays nil. A call whose context
// has a deadline waits for a connection only until the deadline, but
// does not cut the connect short: an acquisition whose caller left goes
// on for up to 10 s (a connect_timeout in the DSN still bounds each
// dial) and its connection goes back to the pool for the next call. At
// most 8 connections of an adapter are being acquired at a time for
// such calls; a call waiting its turn gives up at its deadline. Calls
// without a deadline use the pool as database/sql does.
func Std(db *sql.DB) DB {
	if db == nil {
		return nil
	}
	return stdDB{stdExec{db}, db, newConnGate(db)}
}

// StdTx adapts a caller's database/sql transaction or connection. Query
// needs a QueryContext method too (*sql.Tx and *sql.Conn have one).
func StdTx(q Querier) Executor { return stdExec{q} }

type stdExec struct{ q Querier }

func (e stdExec) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e stdExec) QueryRow(ctx context.Context, query string, args ...any) Row {
	return e.q.QueryRowContext(ctx, query, args...)
}

func (e stdExec) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	if q, ok := e.q.(interface {
		QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	}); ok {
		return q.QueryContext(ctx, query, args...)
	}
	return nil, fmt.Errorf("%T cannot run multi-row queries", e.q)
}

type stdDB struct {
	stdExec
	db   *sql.DB
	gate *connGate // for calls with a deadline
}

func (d stdDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if gated(ctx) {
		return d.gate.exec(ctx, query, args...)
	}
	return d.stdExec.Exec(ctx, query, args...)
}

func (d stdDB) QueryRow(ctx context.Context, query string, args ...any) Row {
	if gated(ctx) {
		return d.gate.queryRow(ctx, query, args...)
	}
	return d.stdExec.QueryRow(ctx, query, args...)
}

func (d stdDB) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	if gated(ctx) {
		return d.gate.query(ctx, query, args...)
	}
	return d.stdExec.Query(ctx, query, args...)
}

func (d stdDB) InTx(ctx context.Context, readCommitted bool, fn func(Executor) error) error {
	var opts *sql.TxOptions
	if readCommitted {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	var tx *sql.Tx
	if gated(ctx) {
		conn, t, err := d.gate.begin(ctx, opts)
		if err != nil {
			return err
		}
		// Deferred first, so it runs after the rollback: a connection
		// waits for its transaction to end before it closes.
		defer conn.Close()
		tx = t
	} else {
		t, err := d.db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		tx = t
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(stdExec{tx}); err != nil {
		return err
	}
	return tx.Commit()
}

func (d stdDB) OnSession(ctx context.Context, fn func(Executor) error) error {
	var conn *sql.Conn
	var err error
	if gated(ctx) {
		conn, err = d.gate.conn(ctx)
	} else {
		conn, err = d.db.Conn(ctx)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	return fn(stdExec{conn})
}
