package middleware_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
)

// readCounter is a driver that counts the reads the inbox makes before
// its transaction.
type readCounter[TTx any] struct {
	repository.Driver[TTx]
	reads *atomic.Int64
}

func (r readCounter[TTx]) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	r.reads.Add(1)
	return r.Driver.Get(ctx, consumer, key)
}

// newCountingInbox is s.newInbox on the store's driver wrapped in a
// readCounter counting into reads.
func (s *store) newCountingInbox(t *testing.T, reads *atomic.Int64, mutate ...func(*middleware.Config)) *middleware.Inbox {
	t.Helper()
	c := middleware.Config{Consumer: "billing", Logger: watermill.NopLogger{}}
	for _, m := range mutate {
		m(&c)
	}
	var (
		inbox *middleware.Inbox
		err   error
	)
	if s.pgxRepo != nil {
		inbox, err = middleware.NewInbox(readCounter[pgx.Tx]{s.pgxRepo, reads}, c)
	} else {
		inbox, err = middleware.NewInbox(readCounter[*sql.Tx]{s.repo, reads}, c)
	}
	require.NoError(t, err)
	return inbox
}

// The inbox reads first by itself while duplicates are frequent: a stream
// of first deliveries is never read first, a replay of copies is answered
// by reads once the share of duplicates passes ReadFirstAbove, and the
// reads stop again when first deliveries return. Outcomes do not change.
func TestInboxReadsFirstWhileDuplicatesAreFrequent(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		var reads atomic.Int64
		mw := s.newCountingInbox(t, &reads).Middleware(h.Handle)
		deliver := func(from, to int) {
			t.Helper()
			for i := from; i < to; i++ {
				out, err := mw(orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 10}))
				require.NoError(t, err)
				require.Len(t, out, 1)
			}
		}

		deliver(0, 40)
		require.Zero(t, reads.Load(), "first deliveries alone are never read first")

		deliver(0, 40) // copies of all 40
		require.GreaterOrEqual(t, reads.Load(), int64(30), "once a quarter of the recent deliveries are duplicates, duplicates are read first")
		require.EqualValues(t, 40, h.runs.Load(), "no copy runs the handler")

		deliver(40, 140)
		afterSwitch := reads.Load()
		deliver(140, 160)
		require.Equal(t, afterSwitch, reads.Load(), "a stream of first deliveries turns the reads off again")
		require.EqualValues(t, 160, h.runs.Load())
		require.Equal(t, 1, s.chargesFor(t, "o-7"))
	}, withPgx...)
}

// With ReadFirstAbove negative the inbox never reads first on its own:
// every duplicate is answered in its transaction, with the same outcome.
func TestInboxAdaptiveReadOff(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		var reads atomic.Int64
		mw := s.newCountingInbox(t, &reads, func(c *middleware.Config) { c.ReadFirstAbove = -1 }).Middleware(h.Handle)
		for range 3 {
			for i := range 20 {
				out, err := mw(orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 10}))
				require.NoError(t, err)
				require.Len(t, out, 1)
			}
		}
		_, err := mw(orderMessage("uuid-3", order{ID: "o-3", Amount: 11}))
		require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)
		require.Zero(t, reads.Load())
		require.EqualValues(t, 20, h.runs.Load())
		require.Equal(t, 1, s.chargesFor(t, "o-3"))
	}, withPgx...)
}
