package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// The pgx repository is a driver of pgx.Tx, which the inbox and the
// version guard take as they take the database/sql one.
var (
	_ repository.Driver[pgx.Tx]       = (*postgres.Repository[pgx.Tx])(nil)
	_ repository.VersionGuard[pgx.Tx] = (*postgres.VersionStore[pgx.Tx])(nil)
)

// TestPgxBeginClaim: on the pgx repository a first delivery sends BEGIN
// and the claim in one round trip, then the handler's statement, the
// stored result and COMMIT; a duplicate (the same conditional claim,
// affecting no row) is read in its transaction and answered from the
// stored record, a payload mismatch is refused, a handler error leaves
// no marker, and none of it costs a new connection or leaves a named
// prepared statement behind. Keys holding quotes, backslashes and
// non-ASCII text travel unharmed.
func TestPgxBeginClaim(t *testing.T) {
	counter := &testenv.QueryCounter{}
	one, repo := pgxClaimPool(t, 1, counter)
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "bill'ing\\", ReadFirstAbove: -1})
	require.NoError(t, err)

	var fail error
	runs := 0
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		tx, err := idempotency.Tx[pgx.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(msg.Context(), `INSERT INTO charges VALUES ($1, 10)`, string(msg.Payload)); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("out-1", msg.Payload)}, fail
	})
	const key = `ké'y\"; DROP TABLE charges; --`

	fail = errors.New("card network unavailable")
	_, err = handler(message.NewMessage(key, []byte("o-1")))
	require.ErrorIs(t, err, fail)
	fail = nil
	before := counter.Load()
	first, err := handler(message.NewMessage(key, []byte("o-1")))
	require.NoError(t, err)
	require.EqualValues(t, 4, counter.Load()-before,
		"a first delivery: BEGIN with the claim (one batch), the handler's INSERT, the stored result, COMMIT")
	for range 5 {
		before = counter.Load()
		again, err := handler(message.NewMessage(key, []byte("o-1")))
		require.NoError(t, err)
		require.Equal(t, first[0].UUID, again[0].UUID, "a duplicate replays the stored output")
		require.EqualValues(t, 3, counter.Load()-before,
			"a duplicate: BEGIN with the claim, the read of the record in the transaction, ROLLBACK")
	}
	_, err = handler(message.NewMessage(key, []byte("o-2")))
	require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)

	require.Equal(t, 2, runs, "the failed run and the first success")
	var charges int
	require.NoError(t, one.QueryRow(t.Context(), `SELECT COUNT(*) FROM charges`).Scan(&charges))
	require.Equal(t, 1, charges)
	rec, err := repo.Get(context.Background(), "bill'ing\\", key)
	require.NoError(t, err)
	require.Equal(t, key, rec.Key)

	var named int
	require.NoError(t, one.QueryRow(t.Context(),
		`SELECT COUNT(*) FROM pg_prepared_statements WHERE name LIKE 'watermill_idempotent_%'`).Scan(&named))
	require.Zero(t, named, "the claim is no named prepared statement")

	require.EqualValues(t, 1, one.Stat().NewConnsCount(), "duplicates and failures reuse the connection")
	require.Zero(t, one.Stat().AcquiredConns())
}

// TestPgxBeginClaimDuplicateKeepsTheTransaction: BeginClaim of a key
// already claimed answers the stored record and leaves its transaction
// open and usable (no aborted transaction to recover from); the caller
// ends it, and the connection goes back to the pool.
func TestPgxBeginClaimDuplicateKeepsTheTransaction(t *testing.T) {
	pool, repo := pgxClaimPool(t, 1, nil)
	ctx := t.Context()
	now := time.Now()
	p := repository.ClaimParams{Consumer: "billing", Key: "k-1", PayloadHash: repository.HashPayload([]byte("p")),
		Now: now, ExpiresAt: now.Add(time.Hour)}

	tx, claims, err := repo.BeginClaim(ctx, []repository.ClaimParams{p})
	require.NoError(t, err)
	require.True(t, claims[0].Claimed)
	require.NoError(t, repo.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: "billing", Key: "k-1"}))
	require.NoError(t, repo.Commit(ctx, tx))
	require.Zero(t, pool.Stat().AcquiredConns())

	tx, claims, err = repo.BeginClaim(ctx, []repository.ClaimParams{p})
	require.NoError(t, err)
	require.False(t, claims[0].Claimed)
	require.Equal(t, "k-1", claims[0].Existing.Key)
	require.Equal(t, repository.StateCompleted, claims[0].Existing.State)
	var one int
	require.NoError(t, tx.QueryRow(ctx, `SELECT 1`).Scan(&one), "the transaction is still open after a duplicate")
	require.NoError(t, repo.Rollback(ctx, tx))
	require.NoError(t, repo.Rollback(ctx, tx), "rolling back an ended transaction is nil")
	require.Zero(t, pool.Stat().AcquiredConns())

	// In a transaction begun apart, Claim answers the same.
	tx, err = repo.Begin(ctx)
	require.NoError(t, err)
	claims, err = repo.Claim(ctx, tx, []repository.ClaimParams{p})
	require.NoError(t, err)
	require.False(t, claims[0].Claimed)
	require.NoError(t, repo.Rollback(ctx, tx))
	require.Zero(t, pool.Stat().AcquiredConns())
}

// TestPgxBeginClaimBatch: under group commit a batch of first deliveries
// costs BEGIN, one multi-row claim of all its keys, its handlers'
// statements and COMMIT. A batch holding keys already processed replays
// the copies without running their handlers, and the others commit
// once. Keys with quotes and backslashes travel unharmed.
func TestPgxBeginClaimBatch(t *testing.T) {
	counter := &testenv.QueryCounter{}
	pool, repo := pgxClaimPool(t, 4, counter)

	const size = 8
	inbox, err := middleware.NewInbox(repo, middleware.Config{
		Consumer: "bill'ing\\",
		// MaxWait an hour: a batch runs only when full.
		Batch: middleware.BatchConfig{MaxMessages: size, MaxWait: time.Hour},
	})
	require.NoError(t, err)
	var runs atomic.Int64
	mw := inbox.Middleware(pgxCharge(&runs, true))
	deliver := func(keys []string) [][]*message.Message {
		outs, errs := make([][]*message.Message, len(keys)), make([]error, len(keys))
		var wg sync.WaitGroup
		for k, key := range keys {
			wg.Go(func() { outs[k], errs[k] = mw(message.NewMessage(key, []byte("p-"+key))) })
		}
		wg.Wait()
		for k, err := range errs {
			require.NoError(t, err, "delivery of %s", keys[k])
		}
		return outs
	}
	keys := func(from, to int) []string {
		var out []string
		for k := from; k < to; k++ {
			out = append(out, fmt.Sprintf(`k'%d\`, k))
		}
		return out
	}

	before := counter.Load()
	first := deliver(keys(0, 2*size))
	require.EqualValues(t, 2*(2+2*size+1), counter.Load()-before,
		"per batch: BEGIN, the claim of its keys, per handler its INSERT and the stored output, COMMIT")
	require.EqualValues(t, 2*size, runs.Load())

	// Half the next batch are copies: they replay, the rest commit once.
	again := deliver(append(keys(0, size/2), keys(2*size, 2*size+size/2)...))
	for k := range size / 2 {
		require.Len(t, again[k], 1)
		require.Equal(t, first[k][0].UUID, again[k][0].UUID, "a copy replays the stored output")
	}
	require.EqualValues(t, 2*size+size/2, runs.Load())
	var charges, distinct int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM charges`).Scan(&charges, &distinct))
	require.Equal(t, 2*size+size/2, charges)
	require.Equal(t, charges, distinct)
	rec, err := repo.Get(t.Context(), "bill'ing\\", `k'3\`)
	require.NoError(t, err)
	require.Equal(t, `k'3\`, rec.Key)
	require.Zero(t, pool.Stat().AcquiredConns())
}

// TestPgxBatchOnAReservedConnection: a batch runs on the connection it
// reserved (repository.Driver's Reserve), claims, handlers' writes,
// copies' claims and COMMIT included: on a pool of one connection, any
// statement sent through the pool instead would wait for the batch's
// own connection for ever. Every connection goes back to the pool.
func TestPgxBatchOnAReservedConnection(t *testing.T) {
	pool, repo := pgxClaimPool(t, 1, nil)
	inbox, err := middleware.NewInbox(repo, middleware.Config{
		Consumer: "billing",
		Batch:    middleware.BatchConfig{MaxMessages: 8, MaxWait: time.Millisecond, Fixed: true},
	})
	require.NoError(t, err)
	var runs atomic.Int64
	mw := inbox.Middleware(pgxCharge(&runs, false))
	deliver := func(from, to int) {
		errs := make([]error, to-from)
		var wg sync.WaitGroup
		for k := from; k < to; k++ {
			wg.Go(func() { _, errs[k-from] = mw(message.NewMessage(fmt.Sprintf("k-%d", k), []byte("p"))) })
		}
		wg.Wait()
		for k, err := range errs {
			require.NoError(t, err, "delivery of k-%d", from+k)
		}
	}
	deliver(0, 32)
	deliver(16, 48) // half of them copies
	require.EqualValues(t, 48, runs.Load())
	var charges, distinct int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM charges`).Scan(&charges, &distinct))
	require.Equal(t, 48, charges)
	require.Equal(t, charges, distinct)
	require.Zero(t, pool.Stat().AcquiredConns())
}

// pgxCharge is a handler that counts its runs and writes a charge
// through the inbox's pgx.Tx; with output, it returns one message.
func pgxCharge(runs *atomic.Int64, output bool) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		tx, err := idempotency.Tx[pgx.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		_, err = tx.Exec(msg.Context(), `INSERT INTO charges VALUES ($1, 10)`, msg.UUID)
		if !output {
			return nil, err
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, err
	}
}

// pgxClaimPool returns a pool of at most maxConns connections (tracing
// its queries with tracer, if not nil) on a schema of its own, holding
// the default inbox table and a charges table for the handlers' writes,
// and the pgx repository on it.
func pgxClaimPool(t *testing.T, maxConns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, *postgres.Repository[pgx.Tx]) {
	t.Helper()
	cfg := pgxSchemaPool(t).Config()
	cfg.MaxConns = maxConns
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	_, err = pool.Exec(t.Context(), `CREATE TABLE charges (order_id TEXT NOT NULL, amount INTEGER NOT NULL)`)
	require.NoError(t, err)
	return pool, repo
}

// pgxSchemaPool returns a pool whose search_path is a fresh schema,
// dropped when t ends, so fixed table names (sqlc's, the default ones)
// are the test's own.
func pgxSchemaPool(t *testing.T) *pgxpool.Pool { return testenv.PgxSchemaPool(t, "pgxinbox_") }

// What `sqlc generate` writes in pgx/v5 mode (sql_package: "pgx/v5") for
// the query `-- name: InsertCharge :exec`, unchanged but for the names.

type sqlcDBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
}

func newSqlcQueries(db sqlcDBTX) *sqlcQueries { return &sqlcQueries{db: db} }

type sqlcQueries struct{ db sqlcDBTX }

func (q *sqlcQueries) WithTx(tx pgx.Tx) *sqlcQueries { return &sqlcQueries{db: tx} }

const sqlcInsertCharge = `-- name: InsertCharge :exec
INSERT INTO charges (order_id, amount) VALUES ($1, $2)
`

type sqlcInsertChargeParams struct {
	OrderID string
	Amount  int32
}

func (q *sqlcQueries) InsertCharge(ctx context.Context, arg sqlcInsertChargeParams) error {
	_, err := q.db.Exec(ctx, sqlcInsertCharge, arg.OrderID, arg.Amount)
	return err
}

// TestPgxSqlcHandler: a handler passes the inbox's pgx.Tx to sqlc code;
// the insert commits with the marker, rolls back with it, and a
// duplicate does not run it again.
func TestPgxSqlcHandler(t *testing.T) {
	pool, repo := pgxClaimPool(t, 4, nil)
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing"})
	require.NoError(t, err)

	queries, runs := newSqlcQueries(pool), 0
	var failAfterInsert error
	// The handler: 8 lines between the inbox and sqlc.
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		tx, err := idempotency.Tx[pgx.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		if err := queries.WithTx(tx).InsertCharge(msg.Context(), sqlcInsertChargeParams{OrderID: string(msg.Payload), Amount: 10}); err != nil {
			return nil, err
		}
		return nil, failAfterInsert
	})

	failAfterInsert = errors.New("card network unavailable")
	_, err = handler(message.NewMessage("uuid-1", []byte("o-1")))
	require.ErrorIs(t, err, failAfterInsert)
	require.Zero(t, pgxCharges(t, pool), "the insert rolls back with the marker")
	_, err = repo.Get(t.Context(), "billing", "uuid-1")
	require.ErrorIs(t, err, repository.ErrNotFound)

	failAfterInsert = nil
	for range 2 { // the redelivery, then a duplicate
		_, err = handler(message.NewMessage("uuid-1", []byte("o-1")))
		require.NoError(t, err)
	}
	require.Equal(t, 1, pgxCharges(t, pool), "the insert commits with the marker, once")
	require.Equal(t, 2, runs, "the duplicate does not run the handler")
	rec, err := repo.Get(t.Context(), "billing", "uuid-1")
	require.NoError(t, err)
	require.Equal(t, repository.StateCompleted, rec.State)
}

func pgxCharges(t *testing.T, pool *pgxpool.Pool) int {
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT COUNT(*) FROM charges`).Scan(&n))
	return n
}

// TestPgxApplyIfNewer: on the pgx inbox, with a VersionGuard[pgx.Tx], an
// older version than the applied one is stale (the handler's write is
// skipped, the marker commits), a newer one applies, and outside the
// handler there is no transaction.
func TestPgxApplyIfNewer(t *testing.T) {
	pool, repo := pgxClaimPool(t, 4, nil)
	_, err := pool.Exec(t.Context(), `CREATE TABLE prices (sku TEXT PRIMARY KEY, price INTEGER NOT NULL)`)
	require.NoError(t, err)
	versions, err := postgres.NewPgxVersionStore(pool, postgres.VersionConfig{})
	require.NoError(t, err)
	require.NoError(t, versions.Migrate(t.Context()))
	guard, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[pgx.Tx]{Guard: versions})
	require.NoError(t, err)
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "catalog"})
	require.NoError(t, err)

	type priceSet struct {
		SKU     string `json:"sku"`
		Price   int    `json:"price"`
		Version int64  `json:"version"`
	}
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		var p priceSet
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return nil, err
		}
		if err := guard.ApplyIfNewer(msg.Context(), p.SKU, p.Version); err != nil {
			return nil, err
		}
		tx, err := idempotency.Tx[pgx.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		_, err = tx.Exec(msg.Context(), `INSERT INTO prices (sku, price) VALUES ($1, $2)
ON CONFLICT (sku) DO UPDATE SET price = excluded.price`, p.SKU, p.Price)
		return nil, err
	})
	for i, p := range []priceSet{{"sku-1", 20, 2}, {"sku-1", 10, 1}, {"sku-1", 30, 3}} {
		payload, err := json.Marshal(p)
		require.NoError(t, err)
		_, err = handler(message.NewMessage(string(rune('a'+i)), payload))
		require.NoError(t, err, "version %d", p.Version)
	}
	var price int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT price FROM prices WHERE sku = 'sku-1'`).Scan(&price))
	require.Equal(t, 30, price, "version 1 arrived after 2 and was skipped; 3 applied")
	last, err := versions.LastVersion(t.Context(), "catalog", "sku-1")
	require.NoError(t, err)
	require.EqualValues(t, 3, last)

	require.ErrorIs(t, guard.ApplyIfNewer(t.Context(), "sku-1", 4), idempotency.ErrNoTransaction)

	// A transaction of the caller's, with the guard's own scope.
	scoped, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[pgx.Tx]{Guard: versions, Consumer: "catalog"})
	require.NoError(t, err)
	tx, err := pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	require.ErrorIs(t, scoped.ApplyIfNewerTx(t.Context(), tx, "sku-1", 3), middleware.ErrStaleVersion)
	require.NoError(t, scoped.ApplyIfNewerTx(t.Context(), tx, "sku-1", 4))
}
