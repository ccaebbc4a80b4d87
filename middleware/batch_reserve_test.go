package middleware

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// TestBatchFillsWhileItWaitsForAConnection: a batch reserves its
// connection before it takes its deliveries, so the deliveries that come
// while the pool has none free join it. Taking them first, the batch
// would queue for the connection holding only the delivery that came
// first, and the others would form batches of their own behind it.
func TestBatchFillsWhileItWaitsForAConnection(t *testing.T) {
	for _, backend := range []string{"postgres", "sqlite"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			db, repo := reserveTestStore(t, backend)
			db.SetMaxOpenConns(1)
			var (
				mu    sync.Mutex
				sizes []int
			)
			inbox, err := NewInbox(repo, Config{Consumer: "billing", Logger: watermill.NopLogger{},
				Batch: BatchConfig{MaxMessages: 8, MaxWait: time.Millisecond, Fixed: true},
				Observer: reserveObserver(func(d idempotency.Delivery) {
					mu.Lock()
					defer mu.Unlock()
					sizes = append(sizes, d.Batch)
				}),
			})
			require.NoError(t, err)
			ran := make(chan struct{}, 8)
			mw := inbox.Middleware(func(*message.Message) ([]*message.Message, error) {
				ran <- struct{}{}
				return nil, nil
			})

			// The test holds the pool's only connection.
			hold, err := db.Conn(t.Context())
			require.NoError(t, err)
			// Given back on failure too, before the table is dropped.
			t.Cleanup(func() { _ = hold.Close() })
			errs := make(chan error, 8)
			deliver := func(k int) {
				go func() {
					_, err := mw(message.NewMessage(fmt.Sprintf("m-%d", k), []byte(`{}`)))
					errs <- err
				}()
			}
			deliver(0)
			// The first delivery's batch waits for a connection (its
			// MaxWait of 1 ms ran out with nothing else to take) ...
			require.Eventually(t, func() bool { return db.Stats().WaitCount >= 1 }, time.Minute, time.Millisecond)
			// ... while seven more come in: they join it.
			for k := 1; k < 8; k++ {
				deliver(k)
			}
			require.Eventually(t, func() bool {
				inbox.batch.mu.Lock()
				defer inbox.batch.mu.Unlock()
				return len(inbox.batch.pending) == 8
			}, 30*time.Second, time.Millisecond, "the first delivery is still pending, collecting the batch")
			require.NoError(t, hold.Close())
			for range 8 {
				require.NoError(t, <-errs)
			}
			require.Len(t, ran, 8)
			require.Equal(t, []int{8, 8, 8, 8, 8, 8, 8, 8}, sizes, "one batch of all eight")
		})
	}
}

// reserveObserver observes deliveries with a function.
type reserveObserver func(idempotency.Delivery)

func (f reserveObserver) ObserveDelivery(_ context.Context, d idempotency.Delivery) { f(d) }

// reserveTestStore opens backend's database and an inbox table of its own.
func reserveTestStore(t *testing.T, backend string) (*sql.DB, repository.Driver[*sql.Tx]) {
	t.Helper()
	if backend == "sqlite" {
		db := testenv.SQLite(t)
		repo, err := sqlite.NewRepository(db, sqlite.Config{Table: "inbox"})
		require.NoError(t, err)
		require.NoError(t, repo.Migrate(t.Context()))
		return db, repo
	}
	db := testenv.Postgres(t)
	table := "inbox_reserve_" + watermill.NewShortUUID()
	repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table) })
	return db, repo
}

// TestBatchReserveFailureFailsTheDeliveries: with the database gone, a
// batch can neither reserve a connection nor begin on the pool; its
// deliveries fail with that error (the broker redelivers them), none
// hangs, and no handler runs.
func TestBatchReserveFailureFailsTheDeliveries(t *testing.T) {
	db, repo := reserveTestStore(t, "sqlite")
	inbox, err := NewInbox(repo, Config{Consumer: "billing", Logger: watermill.NopLogger{},
		Batch: BatchConfig{MaxMessages: 4, MaxWait: time.Millisecond, Fixed: true},
	})
	require.NoError(t, err)
	var ran atomic.Int64
	mw := inbox.Middleware(func(*message.Message) ([]*message.Message, error) { ran.Add(1); return nil, nil })
	require.NoError(t, db.Close())
	errs := make(chan error, 4)
	for k := range 4 {
		go func() {
			_, err := mw(message.NewMessage(fmt.Sprintf("m-%d", k), []byte(`{}`)))
			errs <- err
		}()
	}
	for range 4 {
		err := <-errs
		// A batch of several that cannot reserve runs its deliveries one
		// by one on the pool, whose BEGIN fails; a batch of one (its
		// MaxWait of 1 ms ran out before the others came, on a busy
		// machine) fails with the reservation's error itself.
		require.Error(t, err)
		require.Truef(t,
			regexp.MustCompile(`^inbox: claim \d+ keys: begin transaction: sql: database is closed$`).MatchString(err.Error()) ||
				regexp.MustCompile(`^inbox: claim \d+ keys: reserve a connection: sql: database is closed$`).MatchString(err.Error()),
			"%v: neither the pool's BEGIN nor the reservation failing on the closed database", err)
	}
	require.Zero(t, ran.Load())
}
