package sqlstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Executor runs one statement: all the store needs of a connection, pool
// or transaction, so any driver fits behind a small adapter (StdDB,
// StdQuerier; pgxexec). Row.Scan reports no row with an error wrapping
// sql.ErrNoRows (pgx's ErrNoRows does).
type Executor interface {
	Exec(ctx context.Context, query string, args ...any) (rowsAffected int64, err error)
	QueryRow(ctx context.Context, query string, args ...any) Row
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Row is one row of a query's result.
type Row interface{ Scan(dest ...any) error }

// Rows is a query's result; *sql.Rows satisfies it.
type Rows interface {
	Row
	Next() bool
	Err() error
	Close() error
}

// DB is the pool the store owns.
type DB interface {
	Executor
	// InTx runs fn in a transaction, committing if it returns nil.
	InTx(ctx context.Context, readCommitted bool, fn func(Executor) error) error
	// OnSession runs fn on one connection, outside a transaction (for
	// session-level locks).
	OnSession(ctx context.Context, fn func(Executor) error) error
}

// StdDB adapts a database/sql pool; nil stays nil.
func StdDB(db *sql.DB) DB {
	if db == nil {
		return nil
	}
	return stdDB{stdExec{db}, db}
}

// StdQuerier adapts a caller's transaction (*sql.Tx, *sql.Conn).
func StdQuerier(q repository.Querier) Executor { return stdExec{q} }

type stdExec struct{ q repository.Querier }

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
	db *sql.DB
}

func (d stdDB) InTx(ctx context.Context, readCommitted bool, fn func(Executor) error) error {
	var opts *sql.TxOptions
	if readCommitted {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := d.db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(stdExec{tx}); err != nil {
		return err
	}
	return tx.Commit()
}

func (d stdDB) OnSession(ctx context.Context, fn func(Executor) error) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return fn(stdExec{conn})
}
