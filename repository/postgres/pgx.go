package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/sqlexec/pgxexec"
)

// pgxTxs are pgx/v5's transactions on a pool, or on the connection
// Reserve took (held).
type pgxTxs struct {
	pool *pgxpool.Pool
	held *pgxpool.Conn
}

func (p pgxTxs) Begin(ctx context.Context) (pgx.Tx, error) {
	if p.held != nil {
		return p.held.Begin(ctx)
	}
	return p.pool.Begin(ctx)
}

func (pgxTxs) Exec(tx pgx.Tx) sqlstore.Executor { return pgxexec.Exec(tx) }

func (pgxTxs) Commit(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return pgx.ErrTxClosed
	}
	return tx.Commit(ctx)
}

func (pgxTxs) Rollback(ctx context.Context, tx pgx.Tx) error {
	if tx == nil {
		return nil
	}
	if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

func (p pgxTxs) Reserve(ctx context.Context) (sqlstore.Txs[pgx.Tx], func(), error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return pgxTxs{pool: p.pool, held: conn}, conn.Release, nil
}

// BeginExec sends BEGIN and query as one pgx.Batch (Batch.BeginTx): one
// round trip, and the transaction stays open whatever the statement
// affected. On an error the transaction is rolled back.
func (p pgxTxs) BeginExec(ctx context.Context, query string, args []any) (pgx.Tx, int64, error) {
	conn, acquired := (*pgx.Conn)(nil), (*pgxpool.Conn)(nil)
	if p.held != nil {
		conn = p.held.Conn()
	} else {
		c, err := p.pool.Acquire(ctx)
		if err != nil {
			return nil, 0, err
		}
		conn, acquired = c.Conn(), c
	}
	batch := &pgx.Batch{}
	batch.BeginTx(pgx.TxOptions{})
	batch.Queue(query, args...)
	br := conn.SendBatch(ctx, batch)
	_, err := br.Exec() // BEGIN
	var n int64
	if err == nil {
		var tag interface{ RowsAffected() int64 }
		tag, err = br.Exec()
		if err == nil {
			n = tag.RowsAffected()
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	tx := pooledTx{br.Tx(), acquired}
	if err != nil {
		if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = errors.Join(err, rerr)
		}
		if acquired != nil {
			acquired.Release() // a no-op if Rollback released it
		}
		return nil, 0, err
	}
	return tx, n, nil
}

// pooledTx is a pgx.Tx begun on a connection acquired from the pool: it
// returns the connection when the transaction ends, as pgxpool.Tx does.
// On a reserved connection conn is nil: it stays reserved.
type pooledTx struct {
	pgx.Tx
	conn *pgxpool.Conn
}

func (t pooledTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	t.release(err)
	return err
}

func (t pooledTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	t.release(err)
	return err
}

// release gives the connection back once the transaction has ended: err
// is not ErrTxClosed (the first Commit or Rollback).
func (t pooledTx) release(err error) {
	if t.conn != nil && !errors.Is(err, pgx.ErrTxClosed) {
		t.conn.Release()
	}
}
