package pgxinbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/middleware/pgxinbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// What `sqlc generate` writes in pgx/v5 mode (sql_package: "pgx/v5") for
// the query `-- name: InsertCharge :exec`, unchanged but for the names.

type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
}

func New(db DBTX) *Queries { return &Queries{db: db} }

type Queries struct{ db DBTX }

func (q *Queries) WithTx(tx pgx.Tx) *Queries { return &Queries{db: tx} }

const insertCharge = `-- name: InsertCharge :exec
INSERT INTO charges (order_id, amount) VALUES ($1, $2)
`

type InsertChargeParams struct {
	OrderID string
	Amount  int32
}

func (q *Queries) InsertCharge(ctx context.Context, arg InsertChargeParams) error {
	_, err := q.db.Exec(ctx, insertCharge, arg.OrderID, arg.Amount)
	return err
}

// TestSqlcHandler: a handler passes the inbox's pgx.Tx to sqlc code; the
// insert commits with the marker, rolls back with it, and a duplicate
// does not run it again.
func TestSqlcHandler(t *testing.T) {
	pool := schemaPool(t)
	_, err := pool.Exec(t.Context(), `CREATE TABLE charges (order_id TEXT NOT NULL, amount INTEGER NOT NULL)`)
	require.NoError(t, err)
	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	inbox, err := middleware.NewInbox(middleware.Config{
		Beginner: pgxinbox.Beginner(pool, repo, pgx.TxOptions{}), Consumer: "billing"})
	require.NoError(t, err)

	queries, runs := New(pool), 0
	var failAfterInsert error
	// The handler: 8 lines between the inbox and sqlc.
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		tx, _ := pgxinbox.TxFromContext(msg.Context())
		err := queries.WithTx(tx).InsertCharge(msg.Context(), InsertChargeParams{OrderID: string(msg.Payload), Amount: 10})
		if err != nil {
			return nil, err
		}
		return nil, failAfterInsert
	})

	failAfterInsert = errors.New("card network unavailable")
	_, err = handler(message.NewMessage("uuid-1", []byte("o-1")))
	require.ErrorIs(t, err, failAfterInsert)
	require.Zero(t, charges(t, pool), "the insert rolls back with the marker")
	_, err = repo.Get(t.Context(), "billing", "uuid-1")
	require.ErrorIs(t, err, repository.ErrNotFound)

	failAfterInsert = nil
	for range 2 { // the redelivery, then a duplicate
		_, err = handler(message.NewMessage("uuid-1", []byte("o-1")))
		require.NoError(t, err)
	}
	require.Equal(t, 1, charges(t, pool), "the insert commits with the marker, once")
	require.Equal(t, 2, runs, "the duplicate does not run the handler")
	rec, err := repo.Get(t.Context(), "billing", "uuid-1")
	require.NoError(t, err)
	require.Equal(t, repository.StateCompleted, rec.State)
}

func charges(t *testing.T, pool *pgxpool.Pool) int {
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT COUNT(*) FROM charges`).Scan(&n))
	return n
}

// schemaPool returns a pool whose search_path is a fresh schema, dropped
// when t ends, so sqlc's fixed table names are the test's own.
func schemaPool(t *testing.T) *pgxpool.Pool { return testenv.PgxSchemaPool(t, "sqlc_") }
