package pgxinbox_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/middleware/pgxinbox"
)

// TestBeginClaimBatch: under group commit a batch of first deliveries
// costs one query for BEGIN and the claim of all its keys, then its
// handlers' statements and COMMIT. A batch holding keys already processed
// falls back to the conditional claim: the copies replay without running
// their handlers and the others commit once. Keys with quotes and
// backslashes travel as literals unharmed.
func TestBeginClaimBatch(t *testing.T) {
	counter := &testenv.QueryCounter{}
	pool, repo := claimPool(t, 4, counter)

	const size = 8
	inbox, err := middleware.NewInbox(middleware.Config{
		Beginner: pgxinbox.Beginner(pool, repo, pgx.TxOptions{}), Consumer: "bill'ing\\",
		// MaxWait an hour: a batch runs only when full.
		Batch: middleware.BatchConfig{MaxMessages: size, MaxWait: time.Hour},
	})
	require.NoError(t, err)
	var runs atomic.Int64
	mw := inbox.Middleware(charge(&runs, true))
	deliver := func(keys []string) [][]*message.Message {
		outs, errs := make([][]*message.Message, len(keys)), make([]error, len(keys))
		var wg sync.WaitGroup
		for k, key := range keys {
			wg.Go(func() { outs[k], errs[k] = mw(message.NewMessage(key, []byte("p-"+key))) })
		}
		wg.Wait()
		for k, err := range errs {
			require.NoError(t, err, "delivery of %s", keys[k])
		}
		return outs
	}
	keys := func(from, to int) []string {
		var out []string
		for k := from; k < to; k++ {
			out = append(out, fmt.Sprintf(`k'%d\`, k))
		}
		return out
	}

	before := counter.Load()
	first := deliver(keys(0, 2*size))
	require.EqualValues(t, 2*(1+2*size+1), counter.Load()-before,
		"per batch: BEGIN with the claim, per handler its INSERT and the stored output, COMMIT")
	require.EqualValues(t, 2*size, runs.Load())

	// Half the next batch are copies: they replay, the rest commit once.
	again := deliver(append(keys(0, size/2), keys(2*size, 2*size+size/2)...))
	for k := range size / 2 {
		require.Len(t, again[k], 1)
		require.Equal(t, first[k][0].UUID, again[k][0].UUID, "a copy replays the stored output")
	}
	require.EqualValues(t, 2*size+size/2, runs.Load())
	var charges, distinct int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM charges`).Scan(&charges, &distinct))
	require.Equal(t, 2*size+size/2, charges)
	require.Equal(t, charges, distinct)
	rec, err := repo.Get(t.Context(), "bill'ing\\", `k'3\`)
	require.NoError(t, err)
	require.Equal(t, `k'3\`, rec.Key)
	require.Zero(t, pool.Stat().AcquiredConns())
}

// TestBatchOnAReservedConnection: a batch runs on the connection it
// reserved (middleware.ReservingBeginner), claims, handlers' writes,
// a duplicate's conditional claim and COMMIT included: on a pool of one
// connection, any statement sent through the pool instead would wait
// for the batch's own connection for ever. Every connection goes back
// to the pool.
func TestBatchOnAReservedConnection(t *testing.T) {
	pool, repo := claimPool(t, 1, nil)
	beginner := pgxinbox.Beginner(pool, repo, pgx.TxOptions{})
	require.Implements(t, (*middleware.ReservingBeginner)(nil), beginner)
	inbox, err := middleware.NewInbox(middleware.Config{
		Beginner: beginner, Consumer: "billing",
		Batch: middleware.BatchConfig{MaxMessages: 8, MaxWait: time.Millisecond, Fixed: true},
	})
	require.NoError(t, err)
	var runs atomic.Int64
	mw := inbox.Middleware(charge(&runs, false))
	deliver := func(from, to int) {
		errs := make([]error, to-from)
		var wg sync.WaitGroup
		for k := from; k < to; k++ {
			wg.Go(func() { _, errs[k-from] = mw(message.NewMessage(fmt.Sprintf("k-%d", k), []byte("p"))) })
		}
		wg.Wait()
		for k, err := range errs {
			require.NoError(t, err, "delivery of k-%d", from+k)
		}
	}
	deliver(0, 32)
	deliver(16, 48) // half of them copies: the batches fall back to the conditional claim
	require.EqualValues(t, 48, runs.Load())
	var charges, distinct int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM charges`).Scan(&charges, &distinct))
	require.Equal(t, 48, charges)
	require.Equal(t, charges, distinct)
	require.Zero(t, pool.Stat().AcquiredConns())
}

// charge is a handler that counts its runs and writes a charge through
// the inbox's pgx.Tx; with output, it returns one message.
func charge(runs *atomic.Int64, output bool) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		tx, _ := pgxinbox.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), `INSERT INTO charges VALUES ($1, 10)`, msg.UUID)
		if !output {
			return nil, err
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, err
	}
}
