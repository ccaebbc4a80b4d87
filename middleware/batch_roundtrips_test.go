package middleware_test

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// TestBatchRoundTrips counts the statements per delivery on PostgreSQL,
// one INSERT per handler: (k + 3) / k in batches of k, against the
// default mode's own (4 before issue 14's item 1: BEGIN, claim, INSERT,
// COMMIT).
func TestBatchRoundTrips(t *testing.T) {
	testenv.Postgres(t) // skips without PostgreSQL
	config, err := pgx.ParseConfig(testenv.PostgresDSN())
	require.NoError(t, err)
	counter := &testenv.QueryCounter{}
	config.Tracer = counter
	db := stdlib.OpenDB(*config)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(32)

	s := newPostgresStoreOn(t, db)
	repo := s.repo

	const n = 64
	perDelivery := func(batch middleware.BatchConfig) float64 {
		inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing", Logger: watermill.NopLogger{}, Batch: batch})
		require.NoError(t, err)
		prefix := randomName("m")
		mw := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			tx, err := idempotency.Tx[*sql.Tx](msg.Context())
			if err != nil {
				return nil, err
			}
			_, err = tx.ExecContext(msg.Context(), `INSERT INTO `+s.charges+` (order_id, amount) VALUES ($1, 1)`, msg.UUID)
			return nil, err
		})
		msgs := make([]*message.Message, n)
		for k := range msgs {
			msgs[k] = message.NewMessage(fmt.Sprintf("%s-%d", prefix, k), []byte("{}"))
		}
		before := counter.Load()
		_, errs := deliverConcurrently(mw, msgs)
		for _, err := range errs {
			require.NoError(t, err)
		}
		return float64(counter.Load()-before) / n
	}
	single := perDelivery(middleware.BatchConfig{})
	// MaxWait an hour: a batch closes only when full (n is a multiple of
	// 8), never because a busy machine was slow to start its deliveries.
	batched := perDelivery(middleware.BatchConfig{MaxMessages: 8, MaxWait: time.Hour})
	t.Logf("statements per delivery: %.2f one transaction each, %.2f in batches of 8", single, batched)
	require.Less(t, batched, single)
	require.InDelta(t, 11.0/8, batched, 0.01, "BEGIN, one claim, 8 INSERTs, COMMIT per 8 deliveries")
}
