package middleware_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// batched turns group commit on.
func batched(maxMessages int, maxWait time.Duration) func(*middleware.Config) {
	return func(c *middleware.Config) {
		c.Batch = middleware.BatchConfig{MaxMessages: maxMessages, MaxWait: maxWait}
	}
}

// txSet records which transaction each run saw, to count batches.
type txSet struct {
	mu  sync.Mutex
	txs map[any]int
}

// add records the inbox transaction of msg's handler run, on either
// driver.
func (s *txSet) add(msg *message.Message) {
	var tx any
	if std, err := idempotency.Tx[*sql.Tx](msg.Context()); err == nil {
		tx = std
	} else if pgxTx, err := idempotency.Tx[pgx.Tx](msg.Context()); err == nil {
		tx = pgxTx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.txs == nil {
		s.txs = map[any]int{}
	}
	s.txs[tx]++
}

func (s *txSet) largest() (n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.txs {
		n = max(n, c)
	}
	return n
}

// deliverConcurrently runs every message through mw at once, one
// goroutine each, and returns each delivery's outputs and error; a
// delivery that panicked has a *recovered error holding the panic.
func deliverConcurrently(mw message.HandlerFunc, msgs []*message.Message) ([][]*message.Message, []error) {
	outs, errs := make([][]*message.Message, len(msgs)), make([]error, len(msgs))
	var wg sync.WaitGroup
	for k, m := range msgs {
		wg.Go(func() { outs[k], errs[k] = deliverRecovered(mw, m) })
	}
	wg.Wait()
	return outs, errs
}

// recovered is the panic a delivery raised, as an error.
type recovered struct{ value any }

func (r *recovered) Error() string { return fmt.Sprintf("delivery panicked: %v", r.value) }

// deliverRecovered runs msg through mw, as a router with Recoverer would:
// a panic comes back as a *recovered error.
func deliverRecovered(mw message.HandlerFunc, msg *message.Message) (out []*message.Message, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, &recovered{r}
		}
	}()
	return mw(msg)
}

// panicOf returns what the delivery that returned err panicked with, or
// nil if it did not panic.
func panicOf(err error) any {
	var r *recovered
	if errors.As(err, &r) {
		return r.value
	}
	return nil
}

// deliverUntilAcked is an at-least-once broker: workers goroutines take
// messages from a queue, and a delivery that fails goes back to it.
func deliverUntilAcked(t *testing.T, mw message.HandlerFunc, msgs []*message.Message, workers int) (failures int) {
	t.Helper()
	queue := make(chan *message.Message, len(msgs))
	for _, m := range msgs {
		queue <- m
	}
	var left atomic.Int64
	left.Store(int64(len(msgs)))
	var failed atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for left.Load() > 0 {
				select {
				case m := <-queue:
					if _, err := mw(m.Copy()); err != nil {
						failed.Add(1)
						queue <- m
						continue
					}
					left.Add(-1)
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		})
	}
	wg.Wait()
	require.Zero(t, left.Load(), "every message is eventually acknowledged")
	return int(failed.Load())
}

func orders(n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for k := range msgs {
		msgs[k] = orderMessage(fmt.Sprintf("uuid-%d", k), order{ID: fmt.Sprintf("o-%d", k), Amount: k + 1})
	}
	return msgs
}

func TestBatchConfigValidation(t *testing.T) {
	repo, err := sqlite.NewRepository(&sql.DB{}, sqlite.Config{})
	require.NoError(t, err)
	for _, c := range []struct {
		batch middleware.BatchConfig
		want  string
	}{
		{middleware.BatchConfig{MaxMessages: -1}, "MaxMessages"},
		{middleware.BatchConfig{MaxMessages: middleware.MaxBatchMessages + 1}, "MaxMessages"},
		{middleware.BatchConfig{MaxMessages: 8, MaxWait: -time.Second}, "MaxWait"},
	} {
		_, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Batch: c.batch})
		require.ErrorContains(t, err, c.want)
	}
}

// TestBatchConcurrentDeliveriesShareCommits: 48 deliveries from 48
// goroutines, a third of them second copies of a key racing the first,
// then every message again (acks lost after the commits). Each order is
// charged once, the handler runs once per key, copies replay the stored
// outputs, and transactions held several deliveries.
func TestBatchConcurrentDeliveriesShareCommits(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		var txs txSet
		h := &chargeHandler{s: s, before: func(msg *message.Message, _ *sql.Tx) error { txs.add(msg); return nil }}
		var observed sync.Map // message UUID → Delivery
		mw := s.newInbox(t, "billing", batched(8, 50*time.Millisecond), func(c *middleware.Config) {
			c.Observer = observerFunc(func(_ context.Context, d idempotency.Delivery) {
				observed.Store(d.MessageUUID+"/"+string(d.Outcome), d)
			})
		}).Middleware(h.Handle)

		msgs := orders(32)
		all := append([]*message.Message{}, msgs...)
		for _, m := range msgs[:16] {
			all = append(all, m.Copy())
		}
		outs, errs := deliverConcurrently(mw, all)
		for k, err := range errs {
			require.NoError(t, err, "delivery %d", k)
		}
		require.EqualValues(t, 32, h.runs.Load(), "one run per key, none for copies")
		require.Greater(t, txs.largest(), 1, "deliveries shared a transaction")
		largest := 0
		observed.Range(func(_, v any) bool {
			d := v.(idempotency.Delivery)
			if d.Outcome == idempotency.OutcomeProcessed {
				require.Positive(t, d.Batch)
				largest = max(largest, d.Batch)
			} else {
				require.Zero(t, d.Batch, "%s is not committed by its batch", d.Outcome)
			}
			return true
		})
		require.Equal(t, txs.largest(), largest, "Delivery.Batch is the size of the committed batch")
		for k := range 32 {
			require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("o-%d", k)))
		}
		for k := range 16 {
			require.Len(t, outs[k], 1)
			require.Len(t, outs[32+k], 1)
			require.Equal(t, outs[k][0].UUID, outs[32+k][0].UUID, "copy %d replays the first delivery's output", k)
		}

		// Crash after the commits, before the acks: the broker delivers
		// everything again, and every redelivery is a duplicate.
		again, errs := deliverConcurrently(mw, copies(msgs))
		for k, err := range errs {
			require.NoError(t, err)
			require.Len(t, again[k], 1)
			require.Equal(t, outs[k][0].UUID, again[k][0].UUID)
		}
		require.EqualValues(t, 32, h.runs.Load())
		require.Equal(t, 32, s.totalCharges(t))
	}, withPgx...)
}

func copies(msgs []*message.Message) []*message.Message {
	out := make([]*message.Message, len(msgs))
	for k, m := range msgs {
		out[k] = m.Copy()
	}
	return out
}

// TestBatchHandlerFailureFailsOnlyItsDelivery: one batch of 8, one
// handler returns an error and one panics. Those two deliveries fail with
// their own error or panic and leave nothing; the other six commit, once.
func TestBatchHandlerFailureFailsOnlyItsDelivery(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		boom := errors.New("card network unavailable")
		var failing atomic.Bool
		failing.Store(true)
		h := &chargeHandler{s: s, before: func(msg *message.Message, _ *sql.Tx) error {
			switch {
			case !failing.Load():
			case msg.UUID == "uuid-3":
				return boom
			case msg.UUID == "uuid-5":
				panic("handler bug")
			}
			return nil
		}}
		// MaxWait is long: the batch runs when all eight are in.
		var batchSizes sync.Map // message UUID → Delivery.Batch
		mw := s.newInbox(t, "billing", batched(8, time.Minute), func(c *middleware.Config) {
			c.Observer = observerFunc(func(_ context.Context, d idempotency.Delivery) { batchSizes.Store(d.MessageUUID, d.Batch) })
		}).Middleware(h.Handle)

		msgs := orders(8)
		outs, errs := deliverConcurrently(mw, msgs)
		for k, err := range errs {
			switch k {
			case 3:
				require.ErrorIs(t, err, boom)
				require.False(t, idempotency.IsPermanent(err))
			case 5:
				// Raised on the delivery's own goroutine, for a
				// Recoverer, as without group commit.
				require.Equal(t, "handler bug", panicOf(err))
			default:
				require.NoError(t, err, "delivery %d", k)
				require.Len(t, outs[k], 1)
				require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("o-%d", k)))
			}
		}
		for k := range 8 {
			size, _ := batchSizes.Load(fmt.Sprintf("uuid-%d", k))
			want := 6 // the six that pass commit together
			if k == 3 || k == 5 {
				want = 0
			}
			require.Equal(t, want, size, "delivery %d", k)
		}
		for _, k := range []int{3, 5} {
			require.Zero(t, s.chargesFor(t, fmt.Sprintf("o-%d", k)))
			_, err := s.repo.Get(t.Context(), "billing", fmt.Sprintf("uuid-%d", k))
			require.ErrorIs(t, err, repository.ErrNotFound, "no marker for a failed delivery")
		}
		require.Equal(t, 6, s.totalCharges(t))

		// The broker redelivers the two; now they pass.
		failing.Store(false)
		_, errs = deliverConcurrently(s.newInbox(t, "billing", batched(8, time.Millisecond)).Middleware(h.Handle), copies([]*message.Message{msgs[3], msgs[5]}))
		require.NoError(t, errors.Join(errs...))
		require.Equal(t, 8, s.totalCharges(t))
	}, withPgx...)
}

// TestBatchDuplicateKeyInOneBatch: two copies of one key arrive with
// seven other deliveries; the copy waits for the next batch and replays
// the first's output.
func TestBatchDuplicateKeyInOneBatch(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing", batched(8, 100*time.Millisecond)).Middleware(h.Handle)
		msgs := orders(7)
		msgs = append(msgs, msgs[0].Copy())
		outs, errs := deliverConcurrently(mw, msgs)
		require.NoError(t, errors.Join(errs...))
		require.EqualValues(t, 7, h.runs.Load())
		require.Equal(t, outs[0][0].UUID, outs[7][0].UUID)
		require.Equal(t, 1, s.chargesFor(t, "o-0"))
	}, withPgx...)
}

// TestBatchCommitFailure: a handler makes the shared commit fail (a
// deferred constraint; on MySQL its connection is killed). Nobody can be
// blamed for a failed commit, so the deliveries run again one by one:
// the culprit fails alone, the others commit once.
func TestBatchCommitFailure(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		var killed atomic.Bool
		h := &chargeHandler{s: s, before: func(msg *message.Message, tx *sql.Tx) error {
			if msg.UUID != "uuid-2" {
				return nil
			}
			// MySQL: the connection dies under the whole batch, and the
			// handler after this one meets the dead connection; the
			// broker's redelivery then succeeds. Elsewhere the commit
			// fails every time, so uuid-2 never passes.
			if s.name == "mysql" && killed.Swap(true) {
				return nil
			}
			return s.failCommit(msg.Context(), tx)
		}}
		mw := s.newInbox(t, "billing", batched(8, time.Minute)).Middleware(h.Handle)
		msgs := orders(8)
		if s.name == "mysql" {
			mw = s.newInbox(t, "billing", batched(8, 10*time.Millisecond)).Middleware(h.Handle)
			failures := deliverUntilAcked(t, mw, msgs, 8)
			require.Positive(t, failures)
			for k := range 8 {
				require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("o-%d", k)))
			}
			return
		}
		_, errs := deliverConcurrently(mw, msgs)
		for k, err := range errs {
			if k == 2 {
				require.ErrorContains(t, err, "commit")
				continue
			}
			require.NoError(t, err, "delivery %d", k)
			require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("o-%d", k)))
		}
		require.Zero(t, s.chargesFor(t, "o-2"))
		_, err := s.repo.Get(t.Context(), "billing", "uuid-2")
		require.ErrorIs(t, err, repository.ErrNotFound)
	})
}

// TestBatchDeadlockRetry: handlers update two shared rows in opposite
// orders, so concurrent batches deadlock; the victim's batch runs again
// and every effect still happens once.
func TestBatchDeadlockRetry(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		counters := randomName("counters")
		_, err := s.db.Exec(`CREATE TABLE ` + counters + ` (id VARCHAR(8) PRIMARY KEY, n INTEGER NOT NULL)`)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = s.db.Exec(`DROP TABLE ` + counters) })
		_, err = s.db.Exec(`INSERT INTO ` + counters + ` (id, n) VALUES ('a', 0), ('b', 0)`)
		require.NoError(t, err)

		var seq atomic.Int64
		h := &chargeHandler{s: s, before: func(msg *message.Message, tx *sql.Tx) error {
			first, second := "a", "b"
			if seq.Add(1)%2 == 0 {
				first, second = "b", "a"
			}
			for _, id := range []string{first, second} {
				if _, err := tx.ExecContext(msg.Context(), s.q(`UPDATE `+counters+` SET n = n + 1 WHERE id = ?`), id); err != nil {
					return err
				}
			}
			return nil
		}}
		mw := s.newInbox(t, "billing", batched(4, 20*time.Millisecond)).Middleware(h.Handle)
		deliverUntilAcked(t, mw, orders(40), 16)
		require.Equal(t, 40, s.totalCharges(t))
		for _, id := range []string{"a", "b"} {
			var n int
			require.NoError(t, s.db.QueryRow(s.q(`SELECT n FROM `+counters+` WHERE id = ?`), id).Scan(&n))
			require.Equal(t, 40, n, "counter %s", id)
		}
		t.Logf("%s: %d handler runs for 40 deliveries", s.name, h.runs.Load())
	}, "postgres", "mysql")
}

// TestBatchOutputsToOutbox: outputs go to the outbox in the shared
// transaction; a failing delivery of the batch leaves no outbox row, the
// others leave exactly theirs, with deterministic UUIDs.
func TestBatchOutputsToOutbox(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		dialect := map[string]sqldialect.Dialect{"postgres": sqldialect.PostgreSQL, "mysql": sqldialect.MySQL, "sqlite": sqldialect.SQLite}[s.name]
		table := randomName("outbox")
		ob, err := outbox.New(outbox.Config{Dialect: dialect, Table: table})
		require.NoError(t, err)
		require.NoError(t, ob.Migrate(t.Context(), s.db))
		t.Cleanup(func() { _, _ = s.db.Exec(`DROP TABLE IF EXISTS ` + table) })

		h := &chargeHandler{s: s, before: func(msg *message.Message, _ *sql.Tx) error {
			if msg.UUID == "uuid-4" {
				return errors.New("declined")
			}
			return nil
		}}
		mw := s.newInbox(t, "billing", batched(8, time.Minute), func(c *middleware.Config) {
			c.Outputs = ob.Outputs("payments")
		}).Middleware(h.Handle)
		outs, errs := deliverConcurrently(mw, orders(8))
		var want []string
		for k, err := range errs {
			if k == 4 {
				require.Error(t, err)
				continue
			}
			require.NoError(t, err)
			require.Empty(t, outs[k], "the relay publishes the outputs")
			want = append(want, middleware.OutputUUID("billing", fmt.Sprintf("uuid-%d", k), 0))
		}
		rows, err := s.db.Query(`SELECT uuid FROM ` + table)
		require.NoError(t, err)
		defer rows.Close()
		var got []string
		for rows.Next() {
			var u string
			require.NoError(t, rows.Scan(&u))
			got = append(got, u)
		}
		require.NoError(t, rows.Err())
		require.ElementsMatch(t, want, got)
	})
}

// TestBatchLeaderStopsWaitingWhenCancelled: a subscriber shutting down
// cancels its deliveries; a batch waiting for company runs at once
// instead of holding the shutdown for MaxWait.
func TestBatchLeaderStopsWaitingWhenCancelled(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		mw := s.newInbox(t, "billing", batched(8, time.Hour)).Middleware(h.Handle)
		ctx, cancel := context.WithCancel(t.Context())
		msg := orderMessage("uuid-1", order{ID: "o-1", Amount: 1})
		msg.SetContext(ctx)
		done := make(chan error, 1)
		go func() { _, err := mw(msg); done <- err }()
		cancel()
		select {
		case err := <-done:
			// The handler ran with a cancelled context: its INSERT may fail,
			// and then nothing is committed.
			if err != nil {
				require.Zero(t, s.chargesFor(t, "o-1"))
			}
		case <-time.After(time.Minute):
			t.Fatal("the batch still waits for company after its delivery was cancelled")
		}
	}, "postgres", "postgres-pgx", "sqlite")
}

type observerFunc func(context.Context, idempotency.Delivery)

func (f observerFunc) ObserveDelivery(ctx context.Context, d idempotency.Delivery) { f(ctx, d) }

// TestBatchDeliveriesReturnAfterTheirCommit: a delivery that was handed
// the collecting of a batch returns once that batch commits, instead of
// collecting again (a leader whose own delivery is done would hold its
// router goroutine, and its ack, for up to MaxWait). The handlers wait
// until every delivery of the round has entered the inbox, so a backlog
// forms and the collecting is handed on from batch to batch. MaxWait is
// an hour and every batch fills (pairs), so only a spurious leader waits.
func TestBatchDeliveriesReturnAfterTheirCommit(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		const perRound = 32
		var entered, target atomic.Int64
		h := &chargeHandler{s: s, before: func(*message.Message, *sql.Tx) error {
			for entered.Load() < target.Load() {
				time.Sleep(time.Millisecond)
			}
			return nil
		}}
		mw := s.newInbox(t, "billing", batched(2, time.Hour), func(c *middleware.Config) {
			c.Key = func(msg *message.Message) (string, error) { entered.Add(1); return msg.UUID, nil }
		}).Middleware(h.Handle)
		for round := range 4 {
			target.Add(perRound)
			msgs := make([]*message.Message, perRound)
			for k := range msgs {
				id := fmt.Sprintf("o-%d-%d", round, k)
				msgs[k] = orderMessage("uuid-"+id, order{ID: id, Amount: k + 1})
			}
			returned := make(chan []error, 1)
			go func() { _, errs := deliverConcurrently(mw, msgs); returned <- errs }()
			select {
			case errs := <-returned:
				for k, err := range errs {
					require.NoError(t, err, "delivery %d", k)
				}
			case <-time.After(time.Minute):
				t.Fatalf("round %d: a delivery still waits after its batch committed", round)
			}
		}
		require.EqualValues(t, 4*perRound, h.runs.Load())
		require.Equal(t, 4*perRound, s.totalCharges(t))
	}, "postgres", "sqlite")
}

// TestBatchStartsWhenNoOtherDeliveryCanJoin: four workers each hold one
// delivery at a time, so a batch never gets more than four. MaxMessages
// is larger, so the first batch waits out MaxWait, which teaches the
// inbox that four is all it gets; every later batch starts as soon as
// the four are in, without waiting MaxWait again, and still holds all
// four.
func TestBatchStartsWhenNoOtherDeliveryCanJoin(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		const workers, rounds = 4, 25
		h := &chargeHandler{s: s}
		var sizes sync.Map // message UUID → Delivery.Batch
		mw := s.newInbox(t, "billing", batched(100, 3*time.Second), func(c *middleware.Config) {
			c.Observer = observerFunc(func(_ context.Context, d idempotency.Delivery) { sizes.Store(d.MessageUUID, d.Batch) })
		}).Middleware(h.Handle)
		returned := make(chan error, 1)
		go func() {
			errs := make([]error, workers)
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for r := range rounds {
						id := fmt.Sprintf("o-%d-%d", w, r)
						if _, errs[w] = mw(orderMessage("uuid-"+id, order{ID: id, Amount: 1})); errs[w] != nil {
							return
						}
					}
				})
			}
			wg.Wait()
			returned <- errors.Join(errs...)
		}()
		select {
		case err := <-returned:
			require.NoError(t, err)
		case <-time.After(time.Minute):
			// Waiting out MaxWait in every round would take 75 s or more.
			t.Fatal("batches still wait out MaxWait although no other delivery can join")
		}
		require.EqualValues(t, workers*rounds, h.runs.Load())
		for w := range workers {
			for r := 1; r < rounds; r++ {
				size, ok := sizes.Load(fmt.Sprintf("uuid-o-%d-%d", w, r))
				require.True(t, ok)
				require.Equal(t, workers, size, "round %d of worker %d: a batch holds every delivery in flight", r, w)
			}
		}
	}, "postgres", "sqlite")
}

// TestBatchFixedKeepsTheLimit: with BatchConfig.Fixed every round of
// concurrent deliveries shares transactions. Without it the adaptive
// policy, after its first window at MaxMessages, measures single
// deliveries, so a later round would run one transaction each.
func TestBatchFixedKeepsTheLimit(t *testing.T) {
	forEachStore(t, func(t *testing.T, s *store) {
		var txs atomic.Pointer[txSet]
		txs.Store(&txSet{})
		h := &chargeHandler{s: s, before: func(msg *message.Message, _ *sql.Tx) error { txs.Load().add(msg); return nil }}
		mw := s.newInbox(t, "billing", func(c *middleware.Config) {
			c.Batch = middleware.BatchConfig{MaxMessages: 8, MaxWait: 50 * time.Millisecond, Fixed: true}
		}).Middleware(h.Handle)
		for round := range 5 { // 5 × 32 deliveries: past the policy's first window
			txs.Store(&txSet{})
			msgs := orders(32)
			for k, m := range msgs {
				m.UUID = fmt.Sprintf("r%d-%d", round, k)
			}
			_, errs := deliverConcurrently(mw, msgs)
			for k, err := range errs {
				require.NoError(t, err, "round %d delivery %d", round, k)
			}
			require.Greater(t, txs.Load().largest(), 1, "round %d: deliveries shared a transaction", round)
		}
		require.EqualValues(t, 160, h.runs.Load())
	})
}
