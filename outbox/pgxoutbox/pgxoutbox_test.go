package pgxoutbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// setup returns a pool on a schema of the test's own holding a migrated
// inbox (default names) and outbox.
func setup(t *testing.T) (*pgxpool.Pool, *postgres.Repository[pgx.Tx], *outbox.Outbox) {
	t.Helper()
	pool := testenv.PgxSchemaPool(t, "pgxoutbox_")
	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL})
	require.NoError(t, err)
	require.NoError(t, pgxoutbox.Migrate(t.Context(), ob, pool))
	return pool, repo, ob
}

// received subscribes to topics and collects the messages published.
type received struct {
	mu   sync.Mutex
	msgs map[string]*message.Message // by UUID
	ch   chan struct{}
}

func subscribe(t *testing.T, pubSub *gochannel.GoChannel, topics ...string) *received {
	t.Helper()
	r := &received{msgs: map[string]*message.Message{}, ch: make(chan struct{}, 100)}
	var wg sync.WaitGroup
	for _, topic := range topics {
		msgs, err := pubSub.Subscribe(context.Background(), topic)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range msgs {
				r.mu.Lock()
				r.msgs[m.UUID] = m
				r.mu.Unlock()
				m.Ack()
				r.ch <- struct{}{}
			}
		}()
	}
	t.Cleanup(func() {
		_ = pubSub.Close()
		wg.Wait()
	})
	return r
}

func (r *received) wait(t *testing.T, n int) map[string]*message.Message {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		got := len(r.msgs)
		r.mu.Unlock()
		if got >= n {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.msgs
		}
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("%d of %d messages published", got, n)
		}
	}
}

func count(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

// TestPgxInboxOutboxRelay: an inbox on pgx (postgres.NewPgxRepository) hands the
// handler a pgx.Tx; the handler's own outbox write (WriteTx) and its
// returned outputs (Outputs) commit with the marker, roll back with a
// failed handler, and are not written again for a duplicate. A relay on
// the pool, woken only by NOTIFY (PollInterval 1h), publishes them with
// the inbox's deterministic output UUIDs and empties the outbox.
func TestPgxInboxOutboxRelay(t *testing.T) {
	pool, repo, ob := setup(t)

	inbox, err := middleware.NewInbox(repo, middleware.Config{
		Consumer: "shipping",
		Outputs:  pgxoutbox.Outputs(ob, "shipments"),
	})
	require.NoError(t, err)
	runs := 0
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		tx, txErr := idempotency.Tx[pgx.Tx](msg.Context())
		require.NoError(t, txErr)
		audit := message.NewMessage("audit-"+msg.UUID, msg.Payload)
		if err := pgxoutbox.WriteTx(msg.Context(), ob, tx, outbox.Outgoing{Topic: "audit", Message: audit}); err != nil {
			return nil, err
		}
		if string(msg.Payload) == "fail" {
			return nil, errors.New("handler failed after writing")
		}
		return []*message.Message{message.NewMessage("replaced-by-inbox", []byte("shipped "+string(msg.Payload)))}, nil
	})

	_, err = handler(message.NewMessage("order-1", []byte("o-1")))
	require.NoError(t, err)
	_, err = handler(message.NewMessage("order-1", []byte("o-1")))
	require.NoError(t, err, "a duplicate is acknowledged")
	_, err = handler(message.NewMessage("order-2", []byte("fail")))
	require.Error(t, err)
	require.Equal(t, 2, runs, "the duplicate did not run the handler")
	require.Equal(t, 2, count(t, pool, outbox.DefaultTableName), "order-1's audit row and output; nothing of order-2")

	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	got := subscribe(t, pubSub, "audit", "shipments")
	relay, err := pgxoutbox.NewRelay(pool, pubSub, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, PollInterval: time.Hour})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, relay.Close())
		require.NoError(t, <-done)
	})

	msgs := got.wait(t, 2)
	require.Contains(t, msgs, "audit-order-1")
	out := msgs[middleware.OutputUUID("shipping", "order-1", 0)]
	require.NotNil(t, out, "the output keeps the inbox's deterministic UUID: %v", msgs)
	require.Equal(t, "shipped o-1", string(out.Payload))

	// Rows committed while the relay waits: only NOTIFY can wake it.
	_, err = handler(message.NewMessage("order-3", []byte("o-3")))
	require.NoError(t, err)
	msgs = got.wait(t, 4)
	require.Contains(t, msgs, "audit-order-3")
	require.Contains(t, msgs, middleware.OutputUUID("shipping", "order-3", 0))
	require.Eventually(t, func() bool { return count(t, pool, outbox.DefaultTableName) == 0 }, 10*time.Second, 5*time.Millisecond)
}

// TestOutputsNeedPgxInbox: outbox.Outputs (database/sql) on an inbox on
// pgx (a pgx.Tx in the context, no *sql.Tx) fails the delivery and
// writes nothing; pgxoutbox.Outputs outside an inbox (no transaction in
// the context) fails with idempotency.ErrNoTransaction.
func TestOutputsNeedPgxInbox(t *testing.T) {
	ctx := t.Context()
	pool, repo, ob := setup(t)

	inbox, err := middleware.NewInbox(repo, middleware.Config{
		Consumer: "c",
		Outputs:  ob.Outputs("out"),
	})
	require.NoError(t, err)
	_, err = inbox.Middleware(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("x", nil)}, nil
	})(message.NewMessage("m", nil))
	require.ErrorIs(t, err, idempotency.ErrNoTransaction)
	require.ErrorContains(t, err, "pgxoutbox.Outputs")
	require.Zero(t, count(t, pool, outbox.DefaultTableName))

	err = pgxoutbox.Outputs(ob, "out").WriteOutputs(ctx, []*message.Message{message.NewMessage("x", nil)})
	require.ErrorIs(t, err, idempotency.ErrNoTransaction)
	require.ErrorContains(t, err, "outbox.Outbox.Outputs")
	require.Zero(t, count(t, pool, outbox.DefaultTableName))
}
