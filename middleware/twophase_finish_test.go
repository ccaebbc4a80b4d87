package middleware_test

import (
	"context"
	"database/sql"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// unreachable returns a repository whose database address answers
// nothing (a port that was just closed): every call fails with a real
// "connection refused".
func unreachable(t *testing.T) *postgres.Repository[*sql.Tx] {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	db, err := sql.Open("pgx", "postgres://postgres@"+addr+"/test?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	repo, err := postgres.NewRepository(db, postgres.Config{Table: "unreachable"})
	require.NoError(t, err)
	return repo
}

// flakyRepo sends the first failComplete Complete calls and the first
// failRelease Release calls to an unreachable database; before failing,
// if commitFirst is set, it lets the real store commit the Complete —
// the answer lost after the commit.
type flakyRepo struct {
	leaseRepo
	dead                      *postgres.Repository[*sql.Tx]
	failComplete, failRelease atomic.Int64
	failAcquire               atomic.Int64 // commits, then fails
	commitFirst               bool
	beforeFail                func(p repository.CompleteParams)
	completes, releases       atomic.Int64
}

func (r *flakyRepo) Complete(ctx context.Context, p repository.CompleteParams) error {
	r.completes.Add(1)
	if r.failComplete.Add(-1) >= 0 {
		if r.beforeFail != nil {
			r.beforeFail(p)
		}
		if r.commitFirst {
			if err := r.leaseRepo.Complete(ctx, p); err != nil {
				return err
			}
		}
		return r.dead.Complete(ctx, p)
	}
	return r.leaseRepo.Complete(ctx, p)
}

func (r *flakyRepo) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if r.failAcquire.Add(-1) >= 0 {
		if _, err := r.leaseRepo.Acquire(ctx, p); err != nil {
			return repository.Acquisition{}, err
		}
		return r.dead.Acquire(ctx, p)
	}
	return r.leaseRepo.Acquire(ctx, p)
}

func (r *flakyRepo) Release(ctx context.Context, p repository.LeaseParams) error {
	r.releases.Add(1)
	if r.failRelease.Add(-1) >= 0 {
		return r.dead.Release(ctx, p)
	}
	return r.leaseRepo.Release(ctx, p)
}

func fastRetry(c *middleware.TwoPhaseConfig) {
	c.FinishRetry = idempotency.FinishRetry{MaxAttempts: 5, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond}
}

func TestTwoPhaseCompleteIsRetriedAfterStoreErrors(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, real leaseRepo) {
		repo := &flakyRepo{leaseRepo: real, dead: unreachable(t)}
		repo.failComplete.Store(3)
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo, fastRetry).Middleware(chargeAPI(api, runs))
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))

		out, err := mw(msg)
		require.NoError(t, err, "three failed Completes are retried")
		require.EqualValues(t, 4, repo.completes.Load())
		rec, err := real.Get(t.Context(), "payments", msg.UUID)
		require.NoError(t, err)
		require.Equal(t, repository.StateCompleted, rec.State)

		replayed, err := mw(msg)
		require.NoError(t, err)
		require.Equal(t, out[0].UUID, replayed[0].UUID)
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, api.callsFor(msg.UUID))
	})
}

func TestTwoPhaseCompleteRetriesAreBounded(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, real leaseRepo) {
		repo := &flakyRepo{leaseRepo: real, dead: unreachable(t)}
		repo.failComplete.Store(100)
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo, fastRetry).Middleware(chargeAPI(api, runs))
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))

		_, err := mw(msg)
		require.Error(t, err)
		require.False(t, idempotency.IsPermanent(err), "a store outage is retried by the broker")
		require.EqualValues(t, 5, repo.completes.Load(), "FinishRetry.MaxAttempts")
		rec, err := real.Get(t.Context(), "payments", msg.UUID)
		require.NoError(t, err)
		require.Equal(t, repository.StateInProgress, rec.State, "not completed, not released: the effect happened")
	})
}

// TestTwoPhaseCompleteWhoseAnswerWasLost: the first Complete commits but
// its caller sees a connection error; the retry finds the record
// completed by its own owner and reports success.
func TestTwoPhaseCompleteWhoseAnswerWasLost(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, real leaseRepo) {
		repo := &flakyRepo{leaseRepo: real, dead: unreachable(t), commitFirst: true}
		repo.failComplete.Store(1)
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo, fastRetry).Middleware(chargeAPI(api, runs))
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))

		out, err := mw(msg)
		require.NoError(t, err)
		require.Len(t, out, 1)
		replayed, err := mw(msg)
		require.NoError(t, err)
		require.Equal(t, out[0].UUID, replayed[0].UUID)
		require.EqualValues(t, 1, runs.Load())
	})
}

// TestTwoPhaseRetryStopsWhenTheLeaseIsLost: while Complete is failing,
// another delivery takes the key over; the retry must stop with
// ErrLeaseLost and leave the new owner's record alone.
func TestTwoPhaseRetryStopsWhenTheLeaseIsLost(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, real leaseRepo) {
		repo := &flakyRepo{leaseRepo: real, dead: unreachable(t)}
		repo.failComplete.Store(1)
		repo.beforeFail = func(p repository.CompleteParams) {
			// Judged far in the future, the lease has expired: a newer
			// delivery reclaims it.
			later := time.Now().Add(time.Hour)
			_, err := real.Reclaim(context.Background(), repository.ReclaimParams{
				Consumer: p.Consumer, Key: p.Key, PrevOwner: p.Owner, Owner: "newer-owner", Now: later, LeaseUntil: later.Add(time.Minute),
			})
			require.NoError(t, err)
		}
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo, fastRetry).Middleware(chargeAPI(api, runs))
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))

		_, err := mw(msg)
		require.ErrorIs(t, err, repository.ErrLeaseLost)
		require.EqualValues(t, 1, repo.completes.Load(), "no Complete after the lease was lost")
		rec, err := real.Get(t.Context(), "payments", msg.UUID)
		require.NoError(t, err)
		require.Equal(t, repository.StateInProgress, rec.State)
		require.Equal(t, "newer-owner", rec.LeaseOwner)
		require.Nil(t, rec.Result)
	})
}

func TestTwoPhaseReleaseIsRetriedAfterStoreErrors(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, real leaseRepo) {
		repo := &flakyRepo{leaseRepo: real, dead: unreachable(t)}
		repo.failRelease.Store(2)
		mw := newTwoPhase(t, repo, fastRetry).Middleware(func(*message.Message) ([]*message.Message, error) {
			return nil, context.DeadlineExceeded // the effect failed
		})
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		_, err := mw(msg)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.EqualValues(t, 3, repo.releases.Load())
		_, err = real.Get(t.Context(), "payments", msg.UUID)
		require.ErrorIs(t, err, repository.ErrNotFound, "released: the redelivery can run at once")
	})
}

func TestTwoPhaseFinishRetryConfig(t *testing.T) {
	_, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: memory.NewRepository(), Consumer: "payments"})
	require.NoError(t, err, "the defaults are valid")
	for name, mutate := range map[string]func(*middleware.TwoPhaseConfig){
		"negative attempts": func(c *middleware.TwoPhaseConfig) { c.FinishRetry.MaxAttempts = -1 },
		"negative interval": func(c *middleware.TwoPhaseConfig) { c.FinishRetry.InitialInterval = -time.Second },
		"max below initial": func(c *middleware.TwoPhaseConfig) {
			c.FinishRetry.InitialInterval, c.FinishRetry.MaxInterval = time.Second, time.Millisecond
		},
		"store timeout too long": func(c *middleware.TwoPhaseConfig) { c.StoreTimeout = time.Hour },
		"negative store timeout": func(c *middleware.TwoPhaseConfig) { c.StoreTimeout = -time.Second },
	} {
		c := middleware.TwoPhaseConfig{Repository: memory.NewRepository(), Consumer: "payments"}
		mutate(&c)
		_, err := middleware.NewTwoPhaseInbox(c)
		require.ErrorContains(t, err, "config.", name)
		require.Regexp(t, "FinishRetry|StoreTimeout", err.Error(), name)
	}
}

// TestTwoPhaseAcquireWhoseAnswerWasLostIsReleased: an Acquire that
// committed but answered with a connection error would leave the key in
// progress with nobody working on it — busy until the lease expired, then
// poisoned under Intervene although the effect never ran. The attempt
// releases it (fenced by its owner) in the background, without holding
// the delivery, so the redelivery runs once that is done.
func TestTwoPhaseAcquireWhoseAnswerWasLostIsReleased(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, real leaseRepo) {
		repo := &flakyRepo{leaseRepo: real, dead: unreachable(t)}
		repo.failAcquire.Store(1)
		api, runs := &paymentAPI{}, &atomic.Int64{}
		inbox := newTwoPhase(t, repo, fastRetry)
		mw := inbox.Middleware(chargeAPI(api, runs))
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))

		_, err := mw(msg)
		require.Error(t, err)
		require.False(t, idempotency.IsPermanent(err))
		require.NoError(t, inbox.Drain(t.Context()))
		_, err = real.Get(t.Context(), "payments", msg.UUID)
		require.ErrorIs(t, err, repository.ErrNotFound, "the unanswered claim is released")

		_, err = mw(msg)
		require.NoError(t, err, "the redelivery claims and runs at once")
		require.EqualValues(t, 1, runs.Load())
	})
}
