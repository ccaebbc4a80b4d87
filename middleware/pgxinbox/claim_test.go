package pgxinbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/middleware/pgxinbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// TestBeginClaim: BEGIN and the claim go out as one query; a duplicate
// (the claim's unique violation aborts that transaction) is rolled back
// on the same connection and answered from the stored record, a payload
// mismatch is refused, a handler error leaves no marker, and none of it
// costs a new connection; a session that lost the prepared claim falls
// back to plain INSERTs. Keys holding quotes, backslashes and non-ASCII
// text travel as literals unharmed.
func TestBeginClaim(t *testing.T) {
	one, repo := claimPool(t, 1, nil)
	inbox, err := middleware.NewInbox(middleware.Config{
		Beginner: pgxinbox.Beginner(one, repo, pgx.TxOptions{}), Consumer: "bill'ing\\", ReadFirstAbove: -1})
	require.NoError(t, err)

	var fail error
	runs := 0
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		tx, _ := pgxinbox.TxFromContext(msg.Context())
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
	first, err := handler(message.NewMessage(key, []byte("o-1")))
	require.NoError(t, err)
	for range 5 {
		again, err := handler(message.NewMessage(key, []byte("o-1")))
		require.NoError(t, err)
		require.Equal(t, first[0].UUID, again[0].UUID, "a duplicate replays the stored output")
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

	// The claim is prepared on the connection; a session that lost it (a
	// pooler resetting sessions) prepares it again.
	var stmt string
	require.NoError(t, one.QueryRow(t.Context(),
		`SELECT name FROM pg_prepared_statements WHERE name LIKE 'watermill_idempotent_claim_%'`).Scan(&stmt))
	_, err = one.Exec(t.Context(), `DEALLOCATE `+stmt)
	require.NoError(t, err)
	for _, k := range []string{"after-1", "after-2"} {
		_, err = handler(message.NewMessage(k, []byte(k)))
		require.NoError(t, err)
		_, err = handler(message.NewMessage(k, []byte(k)))
		require.NoError(t, err)
	}
	require.Equal(t, 4, runs)

	require.EqualValues(t, 1, one.Stat().NewConnsCount(), "duplicates and failures reuse the connection")
	require.Zero(t, one.Stat().AcquiredConns())
}

// claimPool returns a pool of at most maxConns connections (tracing its
// queries with tracer, if not nil) on a schema of its own, holding the
// default inbox table and a charges table for the handlers' writes.
func claimPool(t *testing.T, maxConns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, *postgres.Repository) {
	t.Helper()
	cfg := schemaPool(t).Config()
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
