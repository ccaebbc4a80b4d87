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
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

type leaseRepo interface {
	repository.TwoPhase
	repository.Reader
}

// forEachLeaseStore runs fn as a parallel subtest per two-phase backend,
// each on a fresh table or key prefix.
func forEachLeaseStore(t *testing.T, fn func(t *testing.T, repo leaseRepo)) {
	for name, open := range map[string]func(t *testing.T) leaseRepo{
		"memory": func(*testing.T) leaseRepo { return memory.NewRepository() },
		"sqlite": func(t *testing.T) leaseRepo {
			db := testenv.SQLite(t)
			repo, err := sqlite.NewRepository(db, sqlite.Config{Table: randomName("inbox")})
			require.NoError(t, err)
			require.NoError(t, repo.Migrate(t.Context()))
			return repo
		},
		"postgres": func(t *testing.T) leaseRepo {
			db := testenv.Postgres(t)
			table := randomName("inbox")
			repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
			require.NoError(t, err)
			require.NoError(t, repo.Migrate(t.Context()))
			t.Cleanup(func() {
				_, err := db.Exec(`DROP TABLE IF EXISTS ` + table)
				require.NoError(t, err)
			})
			return repo
		},
		"postgres-pgx": func(t *testing.T) leaseRepo {
			pool := testenv.PgxPool(t)
			table := randomName("inbox")
			repo, err := postgres.NewPgxRepository(pool, postgres.Config{Table: table})
			require.NoError(t, err)
			require.NoError(t, repo.Migrate(t.Context()))
			t.Cleanup(func() {
				_, err := pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table)
				require.NoError(t, err)
			})
			return repo
		},
		"mysql": func(t *testing.T) leaseRepo {
			db := testenv.MySQL(t)
			table := randomName("inbox")
			repo, err := mysql.NewRepository(db, mysql.Config{Table: table})
			require.NoError(t, err)
			require.NoError(t, repo.Migrate(t.Context()))
			t.Cleanup(func() {
				_, err := db.Exec(`DROP TABLE IF EXISTS ` + table)
				require.NoError(t, err)
			})
			return repo
		},
		"redis": func(t *testing.T) leaseRepo {
			client := testenv.Redis(t)
			repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: testenv.RedisPrefix(t, client)})
			require.NoError(t, err)
			return repo
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, open(t))
		})
	}
}

// paymentAPI stands for a third-party effect that cannot join a
// transaction. It counts calls per key.
type paymentAPI struct {
	mu    sync.Mutex
	calls map[string]int
}

func (p *paymentAPI) charge(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.calls == nil {
		p.calls = map[string]int{}
	}
	p.calls[key]++
}

func (p *paymentAPI) callsFor(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[key]
}

func newTwoPhase(t *testing.T, repo leaseRepo, mutate ...func(*middleware.TwoPhaseConfig)) *middleware.TwoPhaseInbox {
	t.Helper()
	c := middleware.TwoPhaseConfig{Repository: repo, Consumer: "payments"}
	for _, m := range mutate {
		m(&c)
	}
	inbox, err := middleware.NewTwoPhaseInbox(c)
	require.NoError(t, err)
	return inbox
}

// chargeAPI returns a handler that calls the payment API with the
// propagated key and emits one message.
func chargeAPI(api *paymentAPI, runs *atomic.Int64) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		key, ok := idempotency.KeyFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no key in context")
		}
		api.charge(key)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("charged "+key))}, nil
	}
}

func TestTwoPhaseProcessesOnceAndReplays(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo).Middleware(chargeAPI(api, runs))

		var first []*message.Message
		for i := range 3 {
			out, err := mw(message.NewMessage("pay-1", []byte(`{"amount":10}`)))
			require.NoError(t, err)
			require.Len(t, out, 1)
			if i == 0 {
				first = out
			}
			require.Equal(t, first[0].UUID, out[0].UUID)
		}
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, api.callsFor("pay-1"))

		rec, err := repo.Get(t.Context(), "payments", "pay-1")
		require.NoError(t, err)
		require.Equal(t, repository.StateCompleted, rec.State)

		_, err = mw(message.NewMessage("pay-1", []byte(`{"amount":99}`)))
		require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)
		require.True(t, idempotency.IsPermanent(err))
	})
}

func TestTwoPhaseHandlerErrorReleasesClaim(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		fail := true
		runs := 0
		mw := newTwoPhase(t, repo).Middleware(func(msg *message.Message) ([]*message.Message, error) {
			runs++
			if fail {
				return nil, errors.New("payment API returned 503")
			}
			return nil, nil
		})
		_, err := mw(message.NewMessage("pay-1", nil))
		require.ErrorContains(t, err, "503")
		require.False(t, idempotency.IsPermanent(err))
		_, err = repo.Get(t.Context(), "payments", "pay-1")
		require.ErrorIs(t, err, repository.ErrNotFound, "a failed handler releases its claim")

		fail = false
		_, err = mw(message.NewMessage("pay-1", nil))
		require.NoError(t, err)
		require.Equal(t, 2, runs, "the retry runs the handler")
	})
}

func TestTwoPhasePanicReleasesClaim(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		mw := newTwoPhase(t, repo).Middleware(func(*message.Message) ([]*message.Message, error) {
			panic("handler bug")
		})
		require.PanicsWithValue(t, "handler bug", func() { _, _ = mw(message.NewMessage("pay-1", nil)) })
		_, err := repo.Get(t.Context(), "payments", "pay-1")
		require.ErrorIs(t, err, repository.ErrNotFound)
	})
}

// abandon simulates an attempt that claimed the key at t0 and crashed
// mid-effect: its lease is never extended, completed or released.
func abandon(t *testing.T, repo leaseRepo, key string, t0 time.Time, lease time.Duration, payload []byte) {
	t.Helper()
	a, err := repo.Acquire(t.Context(), repository.AcquireParams{
		Consumer: "payments", Key: key, PayloadHash: repository.HashPayload(payload), Owner: "crashed-attempt",
		Now: t0, LeaseUntil: t0.Add(lease), ExpiresAt: t0.Add(24 * time.Hour),
	})
	require.NoError(t, err)
	require.True(t, a.Acquired)
}

func TestTwoPhaseLiveLeaseIsBusy(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		now := time.Now()
		abandon(t, repo, "pay-1", now, time.Hour, nil)
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo).Middleware(chargeAPI(api, runs))

		_, err := mw(message.NewMessage("pay-1", nil))
		require.ErrorIs(t, err, idempotency.ErrInProgress)
		require.False(t, idempotency.IsPermanent(err), "a busy key is retried later, not poisoned")
		require.Zero(t, runs.Load())
		rec, err := repo.Get(t.Context(), "payments", "pay-1")
		require.NoError(t, err)
		require.Equal(t, "crashed-attempt", rec.LeaseOwner)
	})
}

func TestTwoPhaseExpiredLeaseIntervene(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		t0 := time.Now().Add(-time.Hour)
		abandon(t, repo, "pay-1", t0, time.Minute, nil)
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) { c.OnExpiredLease = idempotency.Intervene }).
			Middleware(chargeAPI(api, runs))

		_, err := mw(message.NewMessage("pay-1", nil))
		require.ErrorIs(t, err, idempotency.ErrNeedsIntervention)
		require.True(t, idempotency.IsPermanent(err), "routed to the poison queue")
		require.Zero(t, runs.Load(), "the possibly half-done payment is not repeated")
		rec, err := repo.Get(t.Context(), "payments", "pay-1")
		require.NoError(t, err, "the record is kept for the operator")
		require.Equal(t, repository.StateInProgress, rec.State)
		require.Equal(t, "crashed-attempt", rec.LeaseOwner)
	})
}

func TestTwoPhaseExpiredLeaseReclaimRacesOneWinner(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		t0 := time.Now().Add(-time.Hour)
		abandon(t, repo, "pay-1", t0, time.Minute, []byte("p"))
		api, runs := &paymentAPI{}, &atomic.Int64{}
		release := make(chan struct{})
		handler := chargeAPI(api, runs)
		mw := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) { c.OnExpiredLease = idempotency.Reclaim }).
			Middleware(func(msg *message.Message) ([]*message.Message, error) {
				<-release // hold the reclaimed lease while the others race
				return handler(msg)
			})

		const racers = 16
		var wg sync.WaitGroup
		errs := make([]error, racers)
		var finished atomic.Int32
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer finished.Add(1)
				_, errs[i] = mw(message.NewMessage("pay-1", []byte("p")))
			}()
		}
		// Every racer but the winner returns without running the handler.
		require.Eventually(t, func() bool { return finished.Load() == racers-1 }, 30*time.Second, 5*time.Millisecond)
		close(release)
		wg.Wait()

		winners := 0
		for _, err := range errs {
			if err == nil {
				winners++
				continue
			}
			require.ErrorIs(t, err, idempotency.ErrInProgress)
		}
		require.Equal(t, 1, winners, "exactly one delivery reclaims the expired lease")
		require.EqualValues(t, 1, runs.Load())
		rec, err := repo.Get(t.Context(), "payments", "pay-1")
		require.NoError(t, err)
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Equal(t, 2, rec.Attempts)
	})
}

func TestTwoPhaseConcurrentFirstDeliveries(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		api, runs := &paymentAPI{}, &atomic.Int64{}
		mw := newTwoPhase(t, repo).Middleware(chargeAPI(api, runs))
		const racers = 32
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, racers)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = mw(message.NewMessage("pay-1", nil))
			}()
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, idempotency.ErrInProgress, "losers are told to retry later")
			}
		}
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, api.callsFor("pay-1"))
	})
}

func TestTwoPhaseStaleOwnerCannotComplete(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		running := make(chan struct{})
		var cause error
		mw := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) {
			c.Lease = time.Hour
			c.ExtendEvery = 10 * time.Millisecond
		}).Middleware(func(msg *message.Message) ([]*message.Message, error) {
			close(running)
			<-msg.Context().Done() // the heartbeat notices the takeover
			cause = context.Cause(msg.Context())
			return nil, nil // the handler finishes anyway, as slow effects do
		})

		done := make(chan error, 1)
		go func() {
			_, err := mw(message.NewMessage("pay-1", nil))
			done <- err
		}()
		<-running
		// Another delivery, two hours later, finds the lease expired and
		// takes the record over.
		rec, err := repo.Get(t.Context(), "payments", "pay-1")
		require.NoError(t, err)
		later := time.Now().Add(2 * time.Hour)
		_, err = repo.Reclaim(t.Context(), repository.ReclaimParams{
			Consumer: "payments", Key: "pay-1", PrevOwner: rec.LeaseOwner, Owner: "newer-owner",
			Now: later, LeaseUntil: later.Add(time.Hour),
		})
		require.NoError(t, err)

		err = <-done
		require.ErrorIs(t, err, repository.ErrLeaseLost, "the stale owner's completion is refused")
		require.ErrorIs(t, cause, repository.ErrLeaseLost, "the handler's context was cancelled with the cause")
		rec, err = repo.Get(t.Context(), "payments", "pay-1")
		require.NoError(t, err)
		require.Equal(t, repository.StateInProgress, rec.State)
		require.Equal(t, "newer-owner", rec.LeaseOwner, "the newer owner's record is untouched")
	})
}

func TestTwoPhaseLeaseIsExtendedWhileHandlerRuns(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		const lease = 300 * time.Millisecond
		release := make(chan struct{})
		running := make(chan struct{})
		runs := atomic.Int64{}
		mw := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) {
			c.Lease = lease
			c.ExtendEvery = 50 * time.Millisecond
		}).Middleware(func(*message.Message) ([]*message.Message, error) {
			if runs.Add(1) == 1 {
				close(running)
				<-release
			}
			return nil, nil
		})
		claimed := time.Now()
		done := make(chan error, 1)
		go func() {
			_, err := mw(message.NewMessage("pay-1", nil))
			done <- err
		}()
		<-running
		// Wait until the lease has been pushed past two original leases:
		// by then more than one lease has elapsed since the claim.
		require.Eventually(t, func() bool {
			rec, err := repo.Get(t.Context(), "payments", "pay-1")
			return err == nil && rec.LeaseUntil.After(claimed.Add(2*lease))
		}, 30*time.Second, 10*time.Millisecond)

		_, err := mw(message.NewMessage("pay-1", nil))
		require.ErrorIs(t, err, idempotency.ErrInProgress, "the extended lease still holds off other deliveries")
		close(release)
		require.NoError(t, <-done)
		require.EqualValues(t, 1, runs.Load())
	})
}

func TestTwoPhaseConfigValidate(t *testing.T) {
	repo := memory.NewRepository()
	for name, tc := range map[string]struct {
		c    middleware.TwoPhaseConfig
		want string
	}{
		"no repository":          {middleware.TwoPhaseConfig{Consumer: "c"}, "missing TwoPhaseConfig.Repository"},
		"consumer with NUL":      {middleware.TwoPhaseConfig{Repository: repo, Consumer: "c\x00"}, "TwoPhaseConfig.Consumer contains a NUL byte"},
		"invalid mapped scope":   {middleware.TwoPhaseConfig{Repository: repo, Consumer: "c", HandlerScopes: map[string]string{"mailer": "\xff"}}, `TwoPhaseConfig.HandlerScopes["mailer"] is not valid UTF-8`},
		"extend not below lease": {middleware.TwoPhaseConfig{Repository: repo, Consumer: "c", Lease: time.Second, ExtendEvery: time.Second}, "ExtendEvery must be positive and shorter than Lease"},
		"unknown policy":         {middleware.TwoPhaseConfig{Repository: repo, Consumer: "c", OnExpiredLease: 7}, "unknown policy"},
		"retention below lease":  {middleware.TwoPhaseConfig{Repository: repo, Consumer: "c", Lease: time.Hour, Retention: time.Minute}, "must be longer than Lease"},
		"retention below window": {middleware.TwoPhaseConfig{Repository: repo, Consumer: "c", Retention: time.Hour, RedeliveryWindow: 2 * time.Hour}, "shorter than RedeliveryWindow"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := middleware.NewTwoPhaseInbox(tc.c)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: repo, Consumer: "c"})
	require.NoError(t, err)
}
