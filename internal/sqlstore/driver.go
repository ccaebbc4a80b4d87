package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Txs are one Go driver's transactions: it begins and ends them and runs
// statements in them. StdTxs are database/sql's; repository/postgres has
// pgx's.
type Txs[TTx any] interface {
	Begin(ctx context.Context) (TTx, error)
	// Exec runs statements in tx.
	Exec(tx TTx) Executor
	Commit(ctx context.Context, tx TTx) error
	// Rollback ends tx if it is open; the zero TTx or an ended one: nil.
	Rollback(ctx context.Context, tx TTx) error
	// Reserve takes a connection of the pool: Txs that begin on it, and
	// release.
	Reserve(ctx context.Context) (Txs[TTx], func(), error)
}

// BeginExecer is Txs that can send BEGIN and one statement in one round
// trip (pgx's batches): it returns the open transaction and the rows the
// statement affected; on an error the transaction has ended.
type BeginExecer[TTx any] interface {
	BeginExec(ctx context.Context, query string, args []any) (TTx, int64, error)
}

// ClaimStore is what a Driver needs of its store: *Inbox,
// *PartitionedInbox.
type ClaimStore interface {
	ClaimOn(ctx context.Context, ex Executor, p repository.ClaimParams) (repository.Claim, error)
	ClaimBatchOn(ctx context.Context, ex Executor, params []repository.ClaimParams) ([]repository.Claim, error)
	SaveResultOn(ctx context.Context, ex Executor, p repository.SaveResultParams) error
	Get(ctx context.Context, consumer, key string) (repository.Record, error)
	RetryableTx(err error) bool
}

// Driver implements repository.Driver with a store's statements in a Go
// driver's transactions. The backends' repositories forward to it.
type Driver[TTx any] struct {
	store ClaimStore
	txs   Txs[TTx]
}

// NewDriver returns the Driver of store on txs.
func NewDriver[TTx any](store ClaimStore, txs Txs[TTx]) Driver[TTx] {
	return Driver[TTx]{store: store, txs: txs}
}

// Get reads a record outside any transaction.
func (d Driver[TTx]) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	return d.store.Get(ctx, consumer, key)
}

// Begin begins a transaction.
func (d Driver[TTx]) Begin(ctx context.Context) (TTx, error) { return d.txs.Begin(ctx) }

// Claim claims params in tx: one key with the dialect's claim, several
// with its multi-row claim.
func (d Driver[TTx]) Claim(ctx context.Context, tx TTx, params []repository.ClaimParams) ([]repository.Claim, error) {
	ex := d.txs.Exec(tx)
	if len(params) == 1 {
		c, err := d.store.ClaimOn(ctx, ex, params[0])
		if err != nil {
			return nil, err
		}
		return []repository.Claim{c}, nil
	}
	return d.store.ClaimBatchOn(ctx, ex, params)
}

// BeginClaim begins a transaction and claims params in it. One key on
// Txs that send BEGIN and a statement together (pgx) costs one round
// trip: the same conditional claim, then a read of the record in the
// transaction when the key was taken.
func (d Driver[TTx]) BeginClaim(ctx context.Context, params []repository.ClaimParams) (TTx, []repository.Claim, error) {
	var none TTx
	if be, ok := d.txs.(BeginExecer[TTx]); ok && len(params) == 1 {
		if in, ok := d.store.(*Inbox); ok {
			query, args, err := in.claimSQL(params[0])
			if err != nil {
				return none, nil, err
			}
			tx, n, err := be.BeginExec(ctx, query, args)
			if err != nil {
				return none, nil, in.wrap("claim", err)
			}
			c, err := in.claimed(ctx, d.txs.Exec(tx), params[0], n)
			if err != nil {
				_ = d.txs.Rollback(context.WithoutCancel(ctx), tx)
				return none, nil, err
			}
			return tx, []repository.Claim{c}, nil
		}
	}
	// Not bound to ctx: database/sql would roll the transaction back on
	// its own when ctx is cancelled, racing the commit. The statements
	// still run with ctx.
	tx, err := d.txs.Begin(context.WithoutCancel(ctx))
	if err != nil {
		return none, nil, fmt.Errorf("begin transaction: %w", err)
	}
	claims, err := d.Claim(ctx, tx, params)
	if err != nil {
		_ = d.txs.Rollback(context.WithoutCancel(ctx), tx)
		return none, nil, err
	}
	return tx, claims, nil
}

// SaveResult stores a result in tx.
func (d Driver[TTx]) SaveResult(ctx context.Context, tx TTx, p repository.SaveResultParams) error {
	return d.store.SaveResultOn(ctx, d.txs.Exec(tx), p)
}

// Commit commits tx.
func (d Driver[TTx]) Commit(ctx context.Context, tx TTx) error { return d.txs.Commit(ctx, tx) }

// Rollback rolls tx back.
func (d Driver[TTx]) Rollback(ctx context.Context, tx TTx) error { return d.txs.Rollback(ctx, tx) }

// Retryable reports a deadlock victim or a serialization failure.
func (d Driver[TTx]) Retryable(err error) bool { return d.store.RetryableTx(err) }

// Reserve returns a Driver on one connection of the pool.
func (d Driver[TTx]) Reserve(ctx context.Context) (repository.Driver[TTx], func(), error) {
	txs, release, err := d.txs.Reserve(ctx)
	if err != nil {
		return nil, nil, err
	}
	return Driver[TTx]{store: d.store, txs: txs}, release, nil
}

// StdTxs are database/sql's transactions on DB, or on the connection
// Conn when Reserve took one.
type StdTxs struct {
	DB   *sql.DB
	Conn *sql.Conn
}

// Begin begins a transaction with the driver's default options.
func (s StdTxs) Begin(ctx context.Context) (*sql.Tx, error) {
	if s.Conn != nil {
		return s.Conn.BeginTx(ctx, nil)
	}
	return s.DB.BeginTx(ctx, nil)
}

// Exec runs statements in tx.
func (StdTxs) Exec(tx *sql.Tx) Executor { return StdQuerier(tx) }

// Commit commits tx.
func (StdTxs) Commit(_ context.Context, tx *sql.Tx) error {
	if tx == nil {
		return sql.ErrTxDone
	}
	return tx.Commit()
}

// Rollback rolls tx back; nil for none or an ended one.
func (StdTxs) Rollback(_ context.Context, tx *sql.Tx) error {
	if tx == nil {
		return nil
	}
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// Reserve takes a connection of the pool (DB.Conn): no round trip while
// one is idle.
func (s StdTxs) Reserve(ctx context.Context) (Txs[*sql.Tx], func(), error) {
	conn, err := s.DB.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return StdTxs{DB: s.DB, Conn: conn}, func() { _ = conn.Close() }, nil
}

// claimSQL is the claim of p as sent: its text and arguments.
func (s *Inbox) claimSQL(p repository.ClaimParams) (string, []any, error) {
	if err := storekit.ValidateClaim(p); err != nil {
		return "", nil, err
	}
	args, err := s.claimArgs(p)
	if err != nil {
		return "", nil, err
	}
	text, vals := s.q.claim.send(args)
	return text, vals, nil
}

// claimed answers the claim of p that affected n rows in the
// transaction ex runs in: claimed, or the stored record, read there.
func (s *Inbox) claimed(ctx context.Context, ex Executor, p repository.ClaimParams, n int64) (repository.Claim, error) {
	if n == 1 {
		return repository.Claim{Claimed: true}, nil
	}
	rec, err := s.get(ctx, ex, s.q.lockedGet, p.Consumer, repository.StorageKey(p.Key))
	if errors.Is(err, repository.ErrNotFound) {
		// The key collided with a row that does not match it exactly:
		// deleted in between, or (MySQL, non-strict sql_mode) cut to fit.
		// The broker retries and the next claim decides.
		err = fmt.Errorf("key is taken but no record matches it exactly: %w", err)
	}
	if err != nil {
		return repository.Claim{}, s.wrap("claim", err)
	}
	return repository.Claim{Existing: rec}, nil
}
