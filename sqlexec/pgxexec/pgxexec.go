// Package pgxexec adapts pgx/v5 to the stores' driver-neutral executor
// (sqlexec.Executor, sqlexec.DB): Exec for a caller's pgx.Tx or
// connection, Pool for a pgxpool.Pool a store owns.
//
//	n, err := pgxexec.Exec(tx).Exec(ctx, query, args...)
//
// A package of its own, so that MySQL and SQLite builds never link pgx.
package pgxexec

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// Querier is what pgx's connections, pools and transactions have in
// common: *pgx.Conn, *pgxpool.Pool, *pgxpool.Conn and pgx.Tx satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Exec adapts a caller's pgx connection or transaction (a pgx.Tx).
func Exec(q Querier) sqlexec.Executor { return exec{q} }

// Pool adapts a pgxpool.Pool; nil stays nil.
func Pool(p *pgxpool.Pool) sqlexec.DB {
	if p == nil {
		return nil
	}
	return pool{exec{p}, p}
}

type exec struct{ q Querier }

func (e exec) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := e.q.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// QueryRow returns pgx's row: its no-row error wraps sql.ErrNoRows.
func (e exec) QueryRow(ctx context.Context, query string, args ...any) sqlexec.Row {
	return e.q.QueryRow(ctx, query, args...)
}

func (e exec) Query(ctx context.Context, query string, args ...any) (sqlexec.Rows, error) {
	r, err := e.q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

// rows gives pgx.Rows the error-returning Close of sqlexec.Rows.
type rows struct{ pgx.Rows }

func (r rows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
}

type pool struct {
	exec
	p *pgxpool.Pool
}

func (d pool) InTx(ctx context.Context, readCommitted bool, fn func(sqlexec.Executor) error) error {
	var opts pgx.TxOptions
	if readCommitted {
		opts.IsoLevel = pgx.ReadCommitted
	}
	return pgx.BeginTxFunc(ctx, d.p, opts, func(tx pgx.Tx) error { return fn(exec{tx}) })
}

func (d pool) OnSession(ctx context.Context, fn func(sqlexec.Executor) error) error {
	conn, err := d.p.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return fn(exec{conn})
}
