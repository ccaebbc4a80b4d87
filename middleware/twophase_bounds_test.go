package middleware_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// boundedStoreTimeout is the StoreTimeout of the bound tests: a call must
// answer within 3 × it (besides its handler's time) when the store stops
// answering; the inbox is built to answer within about 2 × it.
const boundedStoreTimeout = 500 * time.Millisecond

// quickFinish retries the last store write quickly, so that Drain ends
// soon once the store answers again.
var quickFinish = idempotency.FinishRetry{MaxAttempts: 50, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond}

// timed runs call and returns how long it took; a call that has not
// returned after limit fails the test (it is left running).
func timed(t *testing.T, limit time.Duration, call func()) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		call()
	}()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("the call has not returned after %s", limit)
		return 0
	}
}

// drained waits for the inbox's background store writes, failing the
// test if they have not ended within a minute.
func drained(t *testing.T, drain func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, drain(ctx), "the background store writes end once the store answers")
}

// TestTwoPhaseStoreThatStopsAnsweringHoldsNoDelivery: a store whose every
// call hangs until its context ends holds a two-phase delivery for at
// most 3 × StoreTimeout besides the handler's time — before the claim
// (the delivery fails, nothing ran), after the claim (the effect ran: the
// delivery fails, its completion goes on in the background and a copy
// replays it once the store answers), and after a failed handler (its
// release goes on in the background, and the retry runs the handler).
func TestTwoPhaseStoreThatStopsAnsweringHoldsNoDelivery(t *testing.T) {
	bound := 3 * boundedStoreTimeout
	setup := func(t *testing.T, h message.HandlerFunc) (*backends.Hanging, *middleware.TwoPhaseInbox, message.HandlerFunc) {
		repo := &backends.Hanging{TwoPhase: memory.NewRepository()}
		inbox := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) {
			c.Lease, c.StoreTimeout, c.FinishRetry = 3*time.Second, boundedStoreTimeout, quickFinish
		})
		return repo, inbox, inbox.Middleware(h)
	}

	t.Run("before the claim", func(t *testing.T) {
		t.Parallel()
		var runs atomic.Int64
		repo, inbox, mw := setup(t, chargeAPI(&paymentAPI{}, &runs))
		repo.Hang.Store(true)
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		var err error
		took := timed(t, 10*bound, func() { _, err = mw(msg) })
		require.Error(t, err)
		require.False(t, idempotency.IsPermanent(err))
		require.Less(t, took, bound)
		require.Zero(t, runs.Load())

		repo.Hang.Store(false)
		drained(t, inbox.Drain)
		_, err = mw(msg)
		require.NoError(t, err)
		require.EqualValues(t, 1, runs.Load())
	})

	t.Run("after the claim", func(t *testing.T) {
		t.Parallel()
		api, runs := &paymentAPI{}, &atomic.Int64{}
		var repo *backends.Hanging
		charge := chargeAPI(api, runs)
		repo, inbox, mw := setup(t, func(msg *message.Message) ([]*message.Message, error) {
			repo.Hang.Store(true) // the store stops answering during the effect
			return charge(msg)
		})
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		var err error
		took := timed(t, 10*bound, func() { _, err = mw(msg) })
		require.Error(t, err, "the completion is not confirmed")
		require.False(t, idempotency.IsPermanent(err))
		require.Less(t, took, bound)

		repo.Hang.Store(false)
		drained(t, inbox.Drain)
		out, err := mw(msg)
		require.NoError(t, err, "the copy replays the completion made in the background")
		require.Len(t, out, 1)
		require.EqualValues(t, 1, runs.Load(), "the effect ran once")
	})

	t.Run("after a failed handler", func(t *testing.T) {
		t.Parallel()
		var repo *backends.Hanging
		var fail atomic.Bool
		fail.Store(true)
		boom := errors.New("payment API unavailable")
		var runs atomic.Int64
		repo, inbox, mw := setup(t, func(*message.Message) ([]*message.Message, error) {
			runs.Add(1)
			if fail.Load() {
				repo.Hang.Store(true)
				return nil, boom
			}
			return nil, nil
		})
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		var err error
		took := timed(t, 10*bound, func() { _, err = mw(msg) })
		require.ErrorIs(t, err, boom)
		require.Less(t, took, bound)

		repo.Hang.Store(false)
		fail.Store(false)
		drained(t, inbox.Drain)
		_, err = mw(msg)
		require.NoError(t, err, "the claim was released in the background: the retry runs")
		require.EqualValues(t, 2, runs.Load())
	})
}

// TestTwoPhaseClaimBlockedByATableLock: a SHARE lock on the inbox table
// (what CREATE INDEX takes, or VACUUM FULL) blocks every claim for
// longer than the lease. Two copies of one message compete; a broker
// redelivers each until it is acknowledged. The claim is bounded by
// StoreTimeout, so no claim comes back with a lease already expired:
// the effect runs once under either policy, and no copy is sent to
// intervention while the other is healthy.
func TestTwoPhaseClaimBlockedByATableLock(t *testing.T) {
	for _, policy := range []idempotency.ExpiredLeasePolicy{idempotency.Reclaim, idempotency.Intervene} {
		for _, driver := range []string{"database/sql", "pgx"} {
			t.Run(policy.String()+"/"+driver, func(t *testing.T) {
				t.Parallel()
				db := testenv.Postgres(t)
				table := randomName("inbox")
				var repo leaseRepo
				var err error
				if driver == "pgx" {
					repo, err = postgres.NewPgxRepository(testenv.PgxPool(t), postgres.Config{Table: table})
				} else {
					repo, err = postgres.NewRepository(db, postgres.Config{Table: table})
				}
				require.NoError(t, err)
				require.NoError(t, repo.(interface{ Migrate(context.Context) error }).Migrate(t.Context()))
				t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table) })

				api := &paymentAPI{}
				var runs atomic.Int64
				charge := chargeAPI(api, &runs)
				lease := 2 * time.Second
				mw := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) {
					c.Lease, c.OnExpiredLease = lease, policy
				}).Middleware(func(msg *message.Message) ([]*message.Message, error) {
					time.Sleep(300 * time.Millisecond) // the effect takes a while
					return charge(msg)
				})

				// The lock is held for 1.5 leases: a claim queued behind it
				// and not bounded would come back with its lease expired.
				lockTx, err := db.BeginTx(t.Context(), nil)
				require.NoError(t, err)
				_, err = lockTx.Exec(`LOCK TABLE ` + table + ` IN SHARE MODE`)
				require.NoError(t, err)
				unlocked := make(chan struct{})
				go func() {
					defer close(unlocked)
					time.Sleep(lease * 3 / 2) // the fault's duration
					_ = lockTx.Rollback()
				}()

				msg := message.NewMessage(watermill.NewUUID(), []byte("charge 10 EUR"))
				var wg sync.WaitGroup
				var permanent atomic.Int64
				for range 2 {
					wg.Go(func() {
						deadline := time.Now().Add(time.Minute)
						for time.Now().Before(deadline) {
							_, err := mw(msg.Copy())
							switch {
							case err == nil:
								return
							case idempotency.IsPermanent(err):
								permanent.Add(1)
								return
							}
							time.Sleep(50 * time.Millisecond) // the broker's redelivery delay
						}
						t.Errorf("copy not acknowledged within a minute")
					})
				}
				wg.Wait()
				<-unlocked
				require.Zero(t, permanent.Load(), "no healthy copy is sent to intervention")
				require.Equal(t, 1, api.callsFor(msg.UUID), "the effect ran once")
				rec, err := repo.Get(t.Context(), "payments", msg.UUID)
				require.NoError(t, err)
				require.Equal(t, repository.StateCompleted, rec.State)
			})
		}
	}
}

// lateClaims is a store whose Acquire ignores its context and answers
// after delay (a driver that does not honour cancellation, a statement
// the server ran after the client gave up), then runs after, if set.
type lateClaims struct {
	leaseRepo
	delay time.Duration
	after func(p repository.AcquireParams)
}

func (l *lateClaims) Acquire(_ context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	time.Sleep(l.delay) // the store's own slowness, not a wait for a condition
	acq, err := l.leaseRepo.Acquire(context.Background(), p)
	if err == nil && l.after != nil {
		l.after(p)
	}
	return acq, err
}

// TestTwoPhaseLateClaimIsRenewedBeforeTheEffect: a claim that comes back
// with less of its lease left than StoreTimeout renews the lease before
// the handler runs; if another delivery took the key over meanwhile, the
// handler does not run and the delivery is retried (busy).
func TestTwoPhaseLateClaimIsRenewedBeforeTheEffect(t *testing.T) {
	const lease, storeTimeout = 2 * time.Second, time.Second
	t.Run("renewed", func(t *testing.T) {
		t.Parallel()
		repo := &lateClaims{leaseRepo: memory.NewRepository(), delay: 1500 * time.Millisecond}
		var leaseLeft time.Duration
		mw := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) {
			c.Lease, c.StoreTimeout = lease, storeTimeout
		}).Middleware(func(msg *message.Message) ([]*message.Message, error) {
			rec, err := repo.Get(msg.Context(), "payments", msg.UUID)
			if err != nil {
				return nil, err
			}
			leaseLeft = time.Until(rec.LeaseUntil)
			return nil, nil
		})
		_, err := mw(message.NewMessage(watermill.NewUUID(), []byte("p")))
		require.NoError(t, err)
		require.Greater(t, leaseLeft, storeTimeout, "the handler ran on a renewed lease, not on the %s the late claim left", lease-repo.delay)
	})
	t.Run("taken over meanwhile", func(t *testing.T) {
		t.Parallel()
		mem := memory.NewRepository()
		repo := &lateClaims{leaseRepo: mem, delay: 1500 * time.Millisecond, after: func(p repository.AcquireParams) {
			// Another delivery found the lease expired and reclaimed it.
			_, err := mem.Reclaim(context.Background(), repository.ReclaimParams{
				Consumer: p.Consumer, Key: p.Key, PrevOwner: p.Owner, Owner: "other",
				Now: p.LeaseUntil, LeaseUntil: p.LeaseUntil.Add(time.Hour),
			})
			if err != nil {
				panic(err)
			}
		}}
		var runs atomic.Int64
		mw := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) {
			c.Lease, c.StoreTimeout, c.OnExpiredLease = lease, storeTimeout, idempotency.Reclaim
		}).Middleware(chargeAPI(&paymentAPI{}, &runs))
		_, err := mw(message.NewMessage(watermill.NewUUID(), []byte("p")))
		require.ErrorIs(t, err, idempotency.ErrInProgress)
		require.Zero(t, runs.Load(), "the handler does not run on a lease another delivery holds")
	})
}

// TestTwoPhaseLeaseSettingsLeaveTimeToExtend: an extension sent every
// ExtendEvery that may take StoreTimeout must land before the lease it
// extends expires, or a healthy delivery could lose its key.
func TestTwoPhaseLeaseSettingsLeaveTimeToExtend(t *testing.T) {
	_, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{
		Repository: memory.NewRepository(), Consumer: "payments",
		Lease: 3 * time.Second, ExtendEvery: 2 * time.Second, StoreTimeout: time.Second,
	})
	require.ErrorContains(t, err, "config.ExtendEvery (2s) + StoreTimeout (1s) must be shorter than Lease (3s)")
	_, err = middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{
		Repository: memory.NewRepository(), Consumer: "payments",
		Lease: 3 * time.Second, ExtendEvery: 1900 * time.Millisecond,
	})
	require.NoError(t, err, "the default StoreTimeout (Lease/3) leaves time")
}
