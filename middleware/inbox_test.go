package middleware_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
)

func TestInboxFreshThenDuplicateReplaysResult(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing").Middleware(h.Handle)

		msg := orderMessage("uuid-1", order{ID: "o-1", Amount: 10})
		first, err := mw(msg)
		require.NoError(t, err)
		require.Len(t, first, 1)

		again := orderMessage("uuid-1", order{ID: "o-1", Amount: 10})
		replayed, err := mw(again)
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		require.Equal(t, first[0].UUID, replayed[0].UUID, "a replay keeps the output's UUID")
		require.Equal(t, []byte(first[0].Payload), []byte(replayed[0].Payload))
		require.Equal(t, "o-1", replayed[0].Metadata.Get("order_id"))

		require.EqualValues(t, 1, h.runs.Load(), "the handler runs once")
		require.Equal(t, 1, s.chargesFor(t, "o-1"))

		rec, err := s.repo.Get(t.Context(), "billing", "uuid-1")
		require.NoError(t, err)
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Equal(t, repository.HashPayload(msg.Payload), rec.PayloadHash)
	}, withPgx...)
}

func TestInboxDuplicateWithoutOutputReplaysNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		runs := 0
		mw := s.newInbox(t, "audit").Middleware(func(msg *message.Message) ([]*message.Message, error) {
			runs++
			return nil, nil
		})
		for range 3 {
			out, err := mw(orderMessage("uuid-1", order{ID: "o-1"}))
			require.NoError(t, err)
			require.Empty(t, out)
		}
		require.Equal(t, 1, runs)
	}, withPgx...)
}

func TestInboxPayloadMismatchIsPermanent(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing").Middleware(h.Handle)

		_, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.NoError(t, err)
		out, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 99}))
		require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)
		require.True(t, idempotency.IsPermanent(err))
		require.Nil(t, out)
		require.EqualValues(t, 1, h.runs.Load())
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
	}, withPgx...)
}

func TestInboxMissingKeyIsPermanent(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing", func(c *middleware.Config) {
			c.Key = middleware.MetadataKey("idempotency_key")
		}).Middleware(h.Handle)

		_, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.ErrorIs(t, err, idempotency.ErrNoKey)
		require.True(t, idempotency.IsPermanent(err))
		require.Contains(t, err.Error(), "idempotency_key")

		mwEmpty := s.newInbox(t, "billing", func(c *middleware.Config) {
			c.Key = func(*message.Message) (string, error) { return "", nil }
		}).Middleware(h.Handle)
		_, err = mwEmpty(orderMessage("uuid-2", order{ID: "o-2", Amount: 10}))
		require.ErrorIs(t, err, idempotency.ErrNoKey)

		require.Zero(t, h.runs.Load(), "no key: the handler never runs")
		require.Zero(t, s.totalCharges(t))
	})
}

func TestInboxHandlerErrorRollsBackAndRetrySucceeds(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		boom := errors.New("card network unavailable")
		fail := true
		h := &chargeHandler{s: s, before: func(*message.Message, *sql.Tx) error {
			if fail {
				return boom
			}
			return nil
		}}
		mw := s.newInbox(t, "billing").Middleware(h.Handle)

		_, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.ErrorIs(t, err, boom)
		require.False(t, idempotency.IsPermanent(err))
		require.Zero(t, s.chargesFor(t, "o-1"), "the charge written before the error is rolled back")
		_, err = s.repo.Get(t.Context(), "billing", "uuid-1")
		require.ErrorIs(t, err, repository.ErrNotFound, "no marker after a failed handler")

		fail = false
		out, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.NoError(t, err)
		require.Len(t, out, 1)
		require.EqualValues(t, 2, h.runs.Load(), "the redelivery runs the handler again")
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
	}, withPgx...)
}

func TestInboxPanicRollsBack(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s, before: func(*message.Message, *sql.Tx) error { panic("handler bug") }}
		mw := s.newInbox(t, "billing").Middleware(h.Handle)

		require.PanicsWithValue(t, "handler bug", func() {
			_, _ = mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		})
		require.Zero(t, s.chargesFor(t, "o-1"))
		_, err := s.repo.Get(t.Context(), "billing", "uuid-1")
		require.ErrorIs(t, err, repository.ErrNotFound)
	}, withPgx...)
}

func TestInboxCommitFailureRollsBackAndRetrySucceeds(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		failNext := true
		h := &chargeHandler{s: s, before: func(msg *message.Message, tx *sql.Tx) error {
			if failNext {
				failNext = false
				return s.failCommit(msg.Context(), tx)
			}
			return nil
		}}
		mw := s.newInbox(t, "billing").Middleware(h.Handle)

		_, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.Error(t, err)
		if s.name == "mysql" {
			// The connection died under the transaction: the next statement
			// (storing the result) fails before the commit is reached.
			require.Contains(t, err.Error(), "invalid connection")
		} else {
			require.Contains(t, err.Error(), "commit")
		}
		require.False(t, idempotency.IsPermanent(err))
		require.Zero(t, s.chargesFor(t, "o-1"))
		_, err = s.repo.Get(t.Context(), "billing", "uuid-1")
		require.ErrorIs(t, err, repository.ErrNotFound)

		_, err = mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.NoError(t, err)
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
		require.EqualValues(t, 2, h.runs.Load())
	})
}

func TestInboxContextAccessors(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		var txErr, wrongTypeErr error
		var sawKey bool
		var key string
		mw := s.newInbox(t, "billing", func(c *middleware.Config) {
			c.Key = middleware.JSONFieldKey("order_id")
		}).Middleware(func(msg *message.Message) ([]*message.Message, error) {
			_, txErr = idempotency.Tx[*sql.Tx](msg.Context())
			_, wrongTypeErr = idempotency.Tx[pgx.Tx](msg.Context())
			key, sawKey = idempotency.KeyFromContext(msg.Context())
			return nil, nil
		})
		msg := orderMessage("uuid-1", order{ID: "o-77", Amount: 1})
		_, err := mw(msg)
		require.NoError(t, err)
		require.NoError(t, txErr)
		require.ErrorIs(t, wrongTypeErr, idempotency.ErrNoTransaction, "asked for another driver's transaction type")
		require.ErrorContains(t, wrongTypeErr, "pgx.Tx")
		require.ErrorContains(t, wrongTypeErr, "*sql.Tx")
		require.True(t, sawKey)
		require.Equal(t, "o-77", key)

		_, err = idempotency.Tx[*sql.Tx](msg.Context())
		require.ErrorIs(t, err, idempotency.ErrNoTransaction, "the finished transaction does not leak out of the handler")
		_, ok := idempotency.KeyFromContext(msg.Context())
		require.False(t, ok)
	})
}

func TestInboxConcurrentDeliveriesRunHandlerOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing").Middleware(h.Handle)

		const racers = 32
		var wg sync.WaitGroup
		start := make(chan struct{})
		outs := make([][]*message.Message, racers)
		errs := make([]error, racers)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := orderMessage("uuid-1", order{ID: "o-1", Amount: 10})
				<-start
				outs[i], errs[i] = mw(msg)
			}()
		}
		close(start)
		wg.Wait()

		for i := range racers {
			require.NoError(t, errs[i], "delivery %d", i)
			require.Len(t, outs[i], 1, "delivery %d", i)
			require.Equal(t, outs[0][0].UUID, outs[i][0].UUID, "every delivery returns the same output")
		}
		require.EqualValues(t, 1, h.runs.Load(), "32 concurrent deliveries of one key run the handler once")
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
	}, withPgx...)
}

func TestInboxConsumersAreScoped(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		billing := &chargeHandler{s: s}
		audit := &chargeHandler{s: s}
		mwBilling := s.newInbox(t, "billing").Middleware(billing.Handle)
		mwAudit := s.newInbox(t, "audit").Middleware(audit.Handle)

		for range 2 {
			_, err := mwBilling(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
			require.NoError(t, err)
			_, err = mwAudit(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
			require.NoError(t, err)
		}
		require.EqualValues(t, 1, billing.runs.Load())
		require.EqualValues(t, 1, audit.runs.Load())
		require.Equal(t, 2, s.chargesFor(t, "o-1"), "one charge per consumer")
	})
}

func TestInboxLongKeyIsHashed(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing").Middleware(h.Handle)
		long := strings.Repeat("k", 5000)
		for range 2 {
			_, err := mw(orderMessage(long, order{ID: "o-1", Amount: 10}))
			require.NoError(t, err)
		}
		_, err := mw(orderMessage(long+"-other", order{ID: "o-2", Amount: 10}))
		require.NoError(t, err)
		require.EqualValues(t, 2, h.runs.Load())
	})
}

func TestInboxRetentionSetsExpiry(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
		mw := s.newInbox(t, "billing", func(c *middleware.Config) {
			c.Retention = 48 * time.Hour
			c.Now = func() time.Time { return now }
		}).Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		_, err := mw(orderMessage("uuid-1", order{ID: "o-1"}))
		require.NoError(t, err)
		rec, err := s.repo.Get(t.Context(), "billing", "uuid-1")
		require.NoError(t, err)
		require.True(t, now.Equal(rec.CreatedAt), "CreatedAt %s", rec.CreatedAt)
		require.True(t, now.Add(48*time.Hour).Equal(rec.ExpiresAt), "ExpiresAt %s", rec.ExpiresAt)
	})
}

// A subscriber shutting down cancels the message context. Once the
// handler has returned, the commit alone decides the outcome: the effects
// and the marker commit, and the delivery reports success.
func TestInboxCommitIsNotRacedByContextCancellation(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing").Middleware(func(msg *message.Message) ([]*message.Message, error) {
			out, err := h.Handle(msg)
			cancel := msg.Context().Value(cancelKey{}).(context.CancelFunc)
			cancel() // the subscriber stops right after the handler returned
			return out, err
		})
		ctx, cancel := context.WithCancel(context.Background())
		msg := orderMessage("uuid-1", order{ID: "o-1", Amount: 10})
		msg.SetContext(context.WithValue(ctx, cancelKey{}, cancel))

		_, err := mw(msg)
		require.NoError(t, err)
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
		_, err = s.repo.Get(context.Background(), "billing", "uuid-1")
		require.NoError(t, err)
	})
}

type cancelKey struct{}

// ReadFirst answers completed keys before opening a transaction; the
// outcomes are the same as without it, and races are still decided by the
// claim.
func TestInboxReadFirst(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing", func(c *middleware.Config) { c.ReadFirst = true }).Middleware(h.Handle)

		const racers = 16
		var wg sync.WaitGroup
		outs := make([][]*message.Message, racers)
		errs := make([]error, racers)
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i], errs[i] = mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
			}()
		}
		wg.Wait()
		for i := range racers {
			require.NoError(t, errs[i])
			require.Equal(t, outs[0][0].UUID, outs[i][0].UUID)
		}
		again, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 10}))
		require.NoError(t, err)
		require.Equal(t, outs[0][0].UUID, again[0].UUID, "a read-first duplicate replays the stored output")
		_, err = mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 11}))
		require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)
		require.EqualValues(t, 1, h.runs.Load())
		require.Equal(t, 1, s.chargesFor(t, "o-1"))
	}, withPgx...)
}
