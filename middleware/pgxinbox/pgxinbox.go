// Package pgxinbox runs the transactional inbox on pgx/v5: the inbox
// transaction is a pgx.Tx begun on a pgxpool.Pool, and a handler reads it
// with TxFromContext and passes it to its own pgx code (sqlc's pgx mode
// included), so its writes commit or roll back with the marker.
//
//	repo, _ := postgres.NewPgxRepository(pool, postgres.Config{})
//	inbox, _ := middleware.NewInbox(middleware.Config{
//		Beginner:   pgxinbox.Beginner(pool, repo, pgx.TxOptions{}),
//		Repository: repo, // optional: for ReadFirst and the adaptive read
//		Consumer:   "shop",
//	})
//
// A first delivery costs the round trips of the handler's own pgx
// transaction: BEGIN and the claim go out together in one pgx.Batch (see
// Beginner's BeginClaim), then the handler's statements, then COMMIT.
// Under group commit (middleware.Config.Batch) a batch's BEGIN and the
// claim of all its keys go out together too.
//
// It is a package of its own so that the middleware package never links
// pgx for MySQL and SQLite users; it imports no backend (Store is an
// interface).
package pgxinbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
	"github.com/idemkit/watermill-idempotent/sqlexec"
	"github.com/idemkit/watermill-idempotent/sqlexec/pgxexec"
)

// Store is what the pgx inbox needs of its inbox store, on a pgx
// transaction (sqlexec.Executor, see pgxexec.Exec): *postgres.Repository
// implements it.
type Store interface {
	ClaimOn(ctx context.Context, ex sqlexec.Executor, p repository.ClaimParams) (repository.Claim, error)
	ClaimBatchOn(ctx context.Context, ex sqlexec.Executor, params []repository.ClaimParams) ([]repository.Claim, error)
	SaveResultOn(ctx context.Context, ex sqlexec.Executor, p repository.SaveResultParams) error
	GetOn(ctx context.Context, ex sqlexec.Executor, consumer, key string) (repository.Record, error)
	// ClaimStatement returns the plain INSERT claiming every key of params
	// and its arguments: a taken key fails it with a unique violation.
	ClaimStatement(params []repository.ClaimParams) (query string, args []any, err error)
}

// VersionStore is what ApplyIfNewer needs of a version store:
// *postgres.VersionStore implements it.
type VersionStore interface {
	AdvanceOn(ctx context.Context, ex sqlexec.Executor, p repository.AdvanceParams) (bool, error)
}

// TxFromContext returns the pgx inbox transaction of the message being
// handled: use msg.Context(). Writes made through it commit or roll back
// together with the deduplication marker. Handlers must not commit or
// roll it back themselves. ok is false outside an inbox handler run by a
// Beginner of this package.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) { return pgxexec.TxFromContext(ctx) }

// Beginner returns a middleware.Beginner that begins each inbox
// transaction on pool with opts and keeps repo's markers in it. repo must
// be on the same database (postgres.NewPgxRepository or NewRepository).
// A nil pool or repo fails every delivery.
func Beginner(pool *pgxpool.Pool, repo Store, opts pgx.TxOptions) middleware.Beginner {
	return beginner{pool: pool, repo: repo, opts: opts}
}

type beginner struct {
	pool *pgxpool.Pool
	repo Store
	opts pgx.TxOptions
	// held, if set, is a connection reserved from pool (Reserve): every
	// transaction begins on it, and ending one does not release it.
	held *pgxpool.Conn
}

func (b beginner) BeginInbox(ctx context.Context) (middleware.InboxTx, error) {
	if b.pool == nil || b.repo == nil {
		return nil, errNil
	}
	tx, err := b.begin(ctx)
	if err != nil {
		return nil, err
	}
	return inboxTx{tx, b.repo}, nil
}

// Reserve implements middleware.ReservingBeginner: it acquires a
// connection of the pool for a group commit's batch.
func (b beginner) Reserve(ctx context.Context) (middleware.Beginner, func(), error) {
	if b.pool == nil || b.repo == nil {
		return nil, nil, errNil
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	b.held = conn
	return b, conn.Release, nil
}

// on is where statements and transactions run: the held connection, or
// the pool.
func (b beginner) on() interface {
	pgxexec.Querier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
} {
	if b.held != nil {
		return b.held.Conn()
	}
	return b.pool
}

// begin begins a transaction on the held connection or the pool.
func (b beginner) begin(ctx context.Context) (pgx.Tx, error) { return b.on().BeginTx(ctx, b.opts) }

// acquire returns the held connection, or one acquired from the pool:
// then acquired is what to release.
func (b beginner) acquire(ctx context.Context) (_ *pgx.Conn, acquired *pgxpool.Conn, _ error) {
	if b.held != nil {
		return b.held.Conn(), nil, nil
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return conn.Conn(), conn, nil
}

// BeginClaim implements middleware.ClaimBeginner: BEGIN and the claim, a
// plain INSERT with bound parameters, go out in one round trip as a
// pgx.Batch begun with Batch.BeginTx (prepared by pgx's statement cache
// the first time on each connection), so a first delivery costs the
// round trips of the handler's own transaction: begin and claim, the
// handler's statements, commit. A key already taken fails the INSERT
// with a unique violation (after waiting for a transaction that holds
// the key to end), which aborts the transaction: it is rolled back and
// the stored record read.
func (b beginner) BeginClaim(ctx context.Context, p repository.ClaimParams) (middleware.InboxTx, repository.Claim, error) {
	if b.pool == nil || b.repo == nil {
		return nil, repository.Claim{}, errNil
	}
	tx, err := b.beginClaiming(ctx, []repository.ClaimParams{p})
	if err == nil {
		return inboxTx{tx, b.repo}, repository.Claim{Claimed: true}, nil
	}
	if !repository.IsUniqueViolation(err) {
		return nil, repository.Claim{}, err
	}
	rec, err := b.repo.GetOn(ctx, pgxexec.Exec(b.on()), p.Consumer, p.Key)
	if errors.Is(err, repository.ErrNotFound) {
		// Deleted since it collided (cleanup): the broker retries and the
		// next claim decides.
		return nil, repository.Claim{}, fmt.Errorf("key is taken but no record matches it: %w", err)
	}
	if err != nil {
		return nil, repository.Claim{}, err
	}
	return nil, repository.Claim{Existing: rec}, nil
}

// BeginClaimBatch implements middleware.BatchClaimBeginner, for group
// commit: BEGIN and one plain multi-row INSERT of every key go out in one
// round trip, as in BeginClaim. A key already taken fails that INSERT
// with a unique violation (after waiting for a transaction that holds the
// key to end); the transaction is then rolled back and begun again, and
// the keys are claimed with the conditional multi-row claim, which tells
// the taken ones apart (their records are read in the transaction).
func (b beginner) BeginClaimBatch(ctx context.Context, params []repository.ClaimParams) (middleware.InboxTx, []repository.Claim, error) {
	if b.pool == nil || b.repo == nil {
		return nil, nil, errNil
	}
	tx, err := b.beginClaiming(ctx, params)
	if err == nil {
		claims := make([]repository.Claim, len(params))
		for k := range claims {
			claims[k].Claimed = true
		}
		return inboxTx{tx, b.repo}, claims, nil
	}
	if !repository.IsUniqueViolation(err) {
		return nil, nil, err
	}
	if tx, err = b.begin(ctx); err != nil {
		return nil, nil, err
	}
	claims, err := b.repo.ClaimBatchOn(ctx, pgxexec.Exec(tx), params)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	return inboxTx{tx, b.repo}, claims, nil
}

// beginClaiming sends BEGIN and the plain claim of params in one batch
// on a connection of the pool and returns the transaction, which
// releases the connection when it ends; on an error it has rolled it
// back. If the server lost a statement prepared on the connection (a
// pooler resetting sessions: SQLSTATE 26000), it prepares them again and
// sends the batch once more.
func (b beginner) beginClaiming(ctx context.Context, params []repository.ClaimParams) (pgx.Tx, error) {
	query, args, err := b.repo.ClaimStatement(params)
	if err != nil {
		return nil, err
	}
	conn, acquired, err := b.acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := b.sendClaim(ctx, conn, query, args)
	if sqldialect.SQLState(err) == "26000" { // invalid_sql_statement_name
		var begin pgx.Batch
		begin.BeginTx(b.opts)
		for _, name := range []string{begin.QueuedQueries[0].SQL, claimName(query)} {
			_ = conn.Deallocate(ctx, name)
		}
		tx, err = b.sendClaim(ctx, conn, query, args)
	}
	if err != nil {
		if acquired != nil {
			acquired.Release() // the pool drops a connection a failed rollback closed
		}
		return nil, err
	}
	return pooledTx{tx, acquired}, nil
}

// sendClaim sends BEGIN and the claim as one pgx.Batch (Batch.BeginTx):
// one round trip. Both are prepared on the connection the first time,
// under names of their own that pgx's statement cache, which drops a
// statement whenever it fails, never evicts: a duplicate's unique
// violation costs the next claim no new prepare. On a connection in
// simple protocol mode pgx writes the arguments into the text itself.
func (b beginner) sendClaim(ctx context.Context, conn *pgx.Conn, query string, args []any) (pgx.Tx, error) {
	batch := &pgx.Batch{}
	batch.BeginTx(b.opts)
	if conn.Config().DefaultQueryExecMode != pgx.QueryExecModeSimpleProtocol {
		begin := batch.QueuedQueries[0].SQL
		if _, err := conn.Prepare(ctx, begin, begin); err != nil {
			return nil, err
		}
		name := claimName(query)
		if _, err := conn.Prepare(ctx, name, query); err != nil {
			return nil, err
		}
		query = name
	}
	batch.Queue(query, args...)
	br := conn.SendBatch(ctx, batch)
	_, err := br.Exec() // BEGIN
	if err == nil {
		_, err = br.Exec() // the claim
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	tx := br.Tx()
	if err != nil {
		if rerr := tx.Rollback(context.WithoutCancel(ctx)); rerr != nil && !errors.Is(rerr, pgx.ErrTxClosed) {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	return tx, nil
}

// claimName names the claim query prepared on a connection.
func claimName(query string) string {
	sum := sha256.Sum256([]byte(query))
	return "watermill_idempotent_claim_" + hex.EncodeToString(sum[:8])
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

type inboxTx struct {
	tx   pgx.Tx
	repo Store
}

func (t inboxTx) Claim(ctx context.Context, p repository.ClaimParams) (repository.Claim, error) {
	return t.repo.ClaimOn(ctx, pgxexec.Exec(t.tx), p)
}

func (t inboxTx) SaveResult(ctx context.Context, p repository.SaveResultParams) error {
	return t.repo.SaveResultOn(ctx, pgxexec.Exec(t.tx), p)
}

func (t inboxTx) WithTx(ctx context.Context) context.Context {
	return pgxexec.WithTx(ctx, t.tx)
}

func (t inboxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t inboxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// ApplyIfNewer is middleware.VersionGuard.ApplyIfNewer for a handler of
// a pgx inbox: in the handler's pgx.Tx it records version as the last
// applied one of entity, in the delivery's scope, if it is newer than
// every version applied before, and returns nil (apply the message);
// otherwise it writes nothing and returns an error wrapping
// middleware.ErrStaleVersion (return it: the inbox commits the marker and
// acknowledges). It returns middleware.ErrNoTransaction outside a pgx
// inbox handler, and a wrapped storage error that must roll the
// transaction back (return it).
func ApplyIfNewer(ctx context.Context, store VersionStore, entity string, version int64) error {
	tx, ok := TxFromContext(ctx)
	scope, _ := idempotency.ScopeFromContext(ctx)
	if !ok || scope == "" {
		return fmt.Errorf("version guard: entity %q: %w", entity, middleware.ErrNoTransaction)
	}
	applied, err := store.AdvanceOn(ctx, pgxexec.Exec(tx), repository.AdvanceParams{Consumer: scope, Entity: entity, Version: version})
	if err != nil {
		return fmt.Errorf("version guard: %w", err)
	}
	if !applied {
		return fmt.Errorf("%w: scope %q, entity %q, version %d is not newer than the applied one", middleware.ErrStaleVersion, scope, entity, version)
	}
	return nil
}

var errNil = errors.New("pgxinbox: Beginner needs a pool and a repository")
var (
	_ middleware.ClaimBeginner      = beginner{}
	_ middleware.BatchClaimBeginner = beginner{}
)
