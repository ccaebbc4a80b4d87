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
// transaction: BEGIN and the claim go out as one query (see
// Beginner's BeginClaim), then the handler's statements, then COMMIT.
// Under group commit (middleware.Config.Batch) a batch's BEGIN and the
// claim of all its keys go out as one query too.
//
// It is a package of its own so that the middleware package never links
// pgx for MySQL and SQLite users.
package pgxinbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore/pgxexec"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

type ctxKey struct{}

// TxFromContext returns the pgx inbox transaction of the message being
// handled: use msg.Context(). Writes made through it commit or roll back
// together with the deduplication marker. Handlers must not commit or
// roll it back themselves. ok is false outside an inbox handler run by a
// Beginner of this package.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	tx, ok = ctx.Value(ctxKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}

// Beginner returns a middleware.Beginner that begins each inbox
// transaction on pool with opts and keeps repo's markers in it. repo must
// be on the same database (postgres.NewPgxRepository or NewRepository).
// A nil pool or repo fails every delivery.
func Beginner(pool *pgxpool.Pool, repo *postgres.Repository, opts pgx.TxOptions) middleware.Beginner {
	b := beginner{pool: pool, repo: repo, opts: opts, literal: new(atomic.Bool)}
	if repo != nil {
		sum := sha256.Sum256([]byte(repo.ClaimStatement()))
		b.stmt = "watermill_idempotent_claim_" + hex.EncodeToString(sum[:8])
	}
	return b
}

type beginner struct {
	pool *pgxpool.Pool
	repo *postgres.Repository
	opts pgx.TxOptions
	// stmt names the claim prepared on each connection; literal is set
	// once a connection lost it (a pooler resetting sessions): from then
	// on claims are sent as plain INSERTs.
	stmt    string
	literal *atomic.Bool
}

func (b beginner) BeginInbox(ctx context.Context) (middleware.InboxTx, error) {
	if b.pool == nil || b.repo == nil {
		return nil, errNil
	}
	tx, err := b.pool.BeginTx(ctx, b.opts)
	if err != nil {
		return nil, err
	}
	return inboxTx{tx, b.repo}, nil
}

// BeginClaim implements middleware.ClaimBeginner: it sends BEGIN and the
// claim as one query ("begin; EXECUTE …": the claim prepared on the
// connection the first time, its values written into the text by the
// store), so a first delivery costs the round trips of the handler's own
// transaction: begin and claim, the handler's statements, commit. The
// claim is a plain INSERT: a key already taken fails it with
// a unique violation (after waiting for a transaction that holds the key
// to end), which aborts the transaction; it is rolled back and the stored
// record read on the same connection.
func (b beginner) BeginClaim(ctx context.Context, p repository.ClaimParams) (middleware.InboxTx, repository.Claim, error) {
	if b.pool == nil || b.repo == nil {
		return nil, repository.Claim{}, errNil
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, repository.Claim{}, err
	}
	tx, err := b.beginClaim(ctx, conn, p, !b.literal.Load())
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "26000" { // invalid_sql_statement_name
		b.literal.Store(true)
		if err = rollback(ctx, conn); err == nil {
			tx, err = b.beginClaim(ctx, conn, p, false)
		}
	}
	if err == nil {
		return inboxTx{pooledTx{tx, conn}, b.repo}, repository.Claim{Claimed: true}, nil
	}
	if err := endFailedClaim(ctx, conn, err); err != nil {
		return nil, repository.Claim{}, err
	}
	rec, err := b.repo.GetOn(ctx, pgxexec.Exec(conn), p.Consumer, p.Key)
	conn.Release()
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
// commit: it sends BEGIN and one plain multi-row INSERT of every key as
// one query, so a batch of first deliveries costs one round trip before
// its handlers run. A key already taken fails that INSERT with a unique
// violation (after waiting for a transaction that holds the key to end);
// the transaction is then rolled back and begun again, and the keys are
// claimed with the conditional multi-row claim, which tells the taken
// ones apart (their records are read in the transaction).
func (b beginner) BeginClaimBatch(ctx context.Context, params []repository.ClaimParams) (middleware.InboxTx, []repository.Claim, error) {
	if b.pool == nil || b.repo == nil {
		return nil, nil, errNil
	}
	claim, err := b.repo.ClaimBatchLiteral(params)
	if err != nil {
		return nil, nil, err
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	tx, err := b.beginWith(ctx, conn, claim)
	if err == nil {
		claims := make([]repository.Claim, len(params))
		for k := range claims {
			claims[k].Claimed = true
		}
		return inboxTx{pooledTx{tx, conn}, b.repo}, claims, nil
	}
	if err := endFailedClaim(ctx, conn, err); err != nil {
		return nil, nil, err
	}
	if tx, err = conn.BeginTx(ctx, b.opts); err != nil {
		conn.Release()
		return nil, nil, err
	}
	claims, err := b.repo.ClaimBatchOn(ctx, pgxexec.Exec(tx), params)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		conn.Release()
		return nil, nil, err
	}
	return inboxTx{pooledTx{tx, conn}, b.repo}, claims, nil
}

// beginClaim sends BEGIN and the claim on conn as one query: the claim
// prepared on the connection (prepared the first time, one round trip)
// and executed with its values written in, or as a plain INSERT.
func (b beginner) beginClaim(ctx context.Context, conn *pgxpool.Conn, p repository.ClaimParams, prepared bool) (pgx.Tx, error) {
	claim := ""
	if prepared {
		if _, err := conn.Conn().Prepare(ctx, b.stmt, b.repo.ClaimStatement()); err == nil {
			if claim, err = b.repo.ClaimExecute(b.stmt, p); err != nil {
				return nil, err
			}
		}
	}
	if claim == "" {
		var err error
		if claim, err = b.repo.ClaimLiteral(p); err != nil {
			return nil, err
		}
	}
	return b.beginWith(ctx, conn, claim)
}

// beginWith begins a transaction on conn whose BEGIN carries query in the
// same round trip ("begin; query").
func (b beginner) beginWith(ctx context.Context, conn *pgxpool.Conn, query string) (pgx.Tx, error) {
	opts := b.opts
	opts.BeginQuery = beginSQL(b.opts) + "; " + query
	return conn.BeginTx(ctx, opts)
}

// endFailedClaim ends the transaction that err, the failure of a claim
// sent with BEGIN, left on conn. It returns nil when err is a unique
// violation (a key is taken), with conn still acquired for the caller to
// read or claim on; otherwise it releases conn and returns the error.
func endFailedClaim(ctx context.Context, conn *pgxpool.Conn, err error) error {
	taken := repository.IsUniqueViolation(err)
	if rerr := rollback(ctx, conn); rerr != nil {
		conn.Release() // the pool drops a connection left in a transaction
		return errors.Join(err, rerr)
	}
	if !taken {
		conn.Release()
		return err
	}
	return nil
}

// rollback ends the transaction a failed claim left on conn, if any.
func rollback(ctx context.Context, conn *pgxpool.Conn) error {
	if conn.Conn().PgConn().TxStatus() == 'I' {
		return nil
	}
	_, err := conn.Exec(context.WithoutCancel(ctx), "rollback")
	return err
}

// beginSQL is the BEGIN statement pgx sends for opts.
func beginSQL(opts pgx.TxOptions) string {
	if opts.BeginQuery != "" {
		return opts.BeginQuery
	}
	q := "begin"
	if opts.IsoLevel != "" {
		q += " isolation level " + string(opts.IsoLevel)
	}
	if opts.AccessMode != "" {
		q += " " + string(opts.AccessMode)
	}
	if opts.DeferrableMode != "" {
		q += " " + string(opts.DeferrableMode)
	}
	return q
}

// pooledTx is a pgx.Tx begun on a connection acquired from the pool: it
// returns the connection when the transaction ends, as pgxpool.Tx does.
type pooledTx struct {
	pgx.Tx
	conn *pgxpool.Conn
}

func (t pooledTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.conn.Release()
	}
	return err
}

func (t pooledTx) Rollback(ctx context.Context) error {
	err := t.Tx.Rollback(ctx)
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.conn.Release()
	}
	return err
}

type inboxTx struct {
	tx   pgx.Tx
	repo *postgres.Repository
}

func (t inboxTx) Claim(ctx context.Context, p repository.ClaimParams) (repository.Claim, error) {
	return t.repo.ClaimOn(ctx, pgxexec.Exec(t.tx), p)
}

func (t inboxTx) SaveResult(ctx context.Context, p repository.SaveResultParams) error {
	return t.repo.SaveResultOn(ctx, pgxexec.Exec(t.tx), p)
}

func (t inboxTx) WithTx(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, t.tx)
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
func ApplyIfNewer(ctx context.Context, store *postgres.VersionStore, entity string, version int64) error {
	tx, ok := TxFromContext(ctx)
	scope, _ := middleware.ScopeFromContext(ctx)
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
