package middleware_test

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
)

// oddOutput is an output message whose UUID, metadata and payload are not
// valid UTF-8: JSON would replay them with U+FFFD.
func oddOutput() *message.Message {
	out := message.NewMessage("out-\xff\xfe-1", []byte{0xff, 0, 0xfe})
	out.Metadata.Set("k\xff", "v\xfe\x00")
	out.Metadata.Set("order_id", "A-1")
	return out
}

func requireSameMessage(t *testing.T, want, got *message.Message) {
	t.Helper()
	require.Equal(t, want.UUID, got.UUID, "UUID must replay byte for byte")
	require.Equal(t, want.Payload, got.Payload)
	require.Equal(t, want.Metadata, got.Metadata)
}

func TestReplayIsByteExact(t *testing.T) {
	t.Run("transactional", func(t *testing.T) {
		forEachStore(t, func(t *testing.T, s *store) {
			inbox := s.newInbox(t, "exact")
			h := inbox.Middleware(func(*message.Message) ([]*message.Message, error) {
				return []*message.Message{oddOutput()}, nil
			})
			msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
			first, err := h(msg)
			require.NoError(t, err)
			replayed, err := h(msg)
			require.NoError(t, err)
			require.Len(t, replayed, 1)
			requireSameMessage(t, first[0], replayed[0])
			requireSameMessage(t, oddOutput(), replayed[0])
		})
	})
	t.Run("two-phase", func(t *testing.T) {
		forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
			h := newTwoPhase(t, repo).Middleware(func(*message.Message) ([]*message.Message, error) {
				return []*message.Message{oddOutput()}, nil
			})
			msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
			_, err := h(msg)
			require.NoError(t, err)
			replayed, err := h(msg)
			require.NoError(t, err)
			require.Len(t, replayed, 1)
			requireSameMessage(t, oddOutput(), replayed[0])
		})
	})
}

func TestVersion1ResultStillReplays(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		// A record completed before the byte-exact format: version 1 JSON.
		v1 := []byte(`{"v":1,"messages":[{"uuid":"out-1","metadata":{"order_id":"A-1"},"payload":"cGFpZA=="}]}`)
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		now := time.Now()
		acq, err := repo.Acquire(t.Context(), repository.AcquireParams{
			Consumer: "payments", Key: msg.UUID, PayloadHash: repository.HashPayload(msg.Payload), Owner: "old",
			Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
		})
		require.NoError(t, err)
		require.True(t, acq.Acquired)
		require.NoError(t, repo.Complete(t.Context(), repository.CompleteParams{Consumer: "payments", Key: msg.UUID, Owner: "old", Result: v1, Now: now}))

		h := newTwoPhase(t, repo).Middleware(func(*message.Message) ([]*message.Message, error) {
			t.Error("a duplicate must not run the handler")
			return nil, nil
		})
		replayed, err := h(msg)
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		require.Equal(t, "out-1", replayed[0].UUID)
		require.Equal(t, "A-1", replayed[0].Metadata.Get("order_id"))
		require.Equal(t, message.Payload("paid"), replayed[0].Payload)
	})
}

// TestResultLargerThanMaxIsPermanent: on MariaDB a 13 MiB output used to
// fail every delivery with "packet bigger than max_allowed_packet", not
// permanent, re-running the handler each time.
func TestResultLargerThanMaxIsPermanent(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 13 MiB outputs")
	}
	forEachStore(t, func(t *testing.T, s *store) {
		h := &chargeHandler{s: s}
		big := func(msg *message.Message) ([]*message.Message, error) {
			if _, err := h.Handle(msg); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("x"), 13<<20))}, nil
		}
		mw := s.newInbox(t, "big").Middleware(big)
		msg := orderMessage(watermill.NewUUID(), order{ID: "big-1", Amount: 1})
		for range 2 {
			_, err := mw(msg)
			require.ErrorIs(t, err, idempotency.ErrResultTooLarge)
			require.True(t, idempotency.IsPermanent(err), "an output too large to store is too large on every redelivery")
			require.ErrorContains(t, err, strconv.Itoa(middleware.DefaultMaxResultBytes), "the error names the limit")
			require.ErrorContains(t, err, "13631", "the error names the size")
		}
		require.Zero(t, s.chargesFor(t, "big-1"), "the transaction rolls back: no effect without a marker")

		// A raised limit stores a result the database accepts.
		mw = s.newInbox(t, "big-allowed", func(c *middleware.Config) { c.MaxResultBytes = 4 << 20 }).Middleware(
			func(msg *message.Message) ([]*message.Message, error) {
				return []*message.Message{message.NewMessage("out-2", bytes.Repeat([]byte("y"), 3<<20))}, nil
			})
		msg = orderMessage(watermill.NewUUID(), order{ID: "big-2", Amount: 1})
		_, err := mw(msg)
		require.NoError(t, err)
		replayed, err := mw(msg)
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		require.Len(t, replayed[0].Payload, 3<<20)
	}, "mysql", "postgres")
}

func TestTwoPhaseResultLargerThanMaxKeepsRecordForOperator(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		var api paymentAPI
		h := newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) { c.MaxResultBytes = 1024 }).Middleware(
			func(msg *message.Message) ([]*message.Message, error) {
				api.charge(msg.UUID)
				return []*message.Message{message.NewMessage("out", bytes.Repeat([]byte("x"), 2048))}, nil
			})
		msg := message.NewMessage(watermill.NewUUID(), []byte("p"))
		_, err := h(msg)
		require.ErrorIs(t, err, idempotency.ErrResultTooLarge)
		require.True(t, idempotency.IsPermanent(err))
		require.ErrorContains(t, err, "limit (MaxResultBytes) is 1024")
		rec, err := repo.Get(t.Context(), "payments", msg.UUID)
		require.NoError(t, err)
		require.Equal(t, repository.StateInProgress, rec.State, "the effect happened: the claim is kept, not released for a re-run")
		require.Equal(t, 1, api.callsFor(msg.UUID))
	})
}

// TestOperatorResolvesWithEncodeResult: the operator's way out of
// ErrNeedsIntervention replays what it stored, and refuses what no
// duplicate could replay.
func TestOperatorResolvesWithEncodeResult(t *testing.T) {
	forEachLeaseStore(t, func(t *testing.T, repo leaseRepo) {
		op, ok := repo.(repository.Operator)
		require.True(t, ok)
		payload := []byte(`{"order_id":"A-9"}`)
		msg := message.NewMessage(watermill.NewUUID(), payload)
		abandon(t, repo, msg.UUID, time.Now().Add(-time.Hour), time.Minute, payload)
		later := time.Now()
		h := newTwoPhase(t, repo).Middleware(func(*message.Message) ([]*message.Message, error) {
			t.Error("the handler must not run: the operator decided")
			return nil, nil
		})
		_, err := h(msg)
		require.ErrorIs(t, err, idempotency.ErrNeedsIntervention)

		stuck, err := op.ListStuck(t.Context(), repository.ListStuckParams{Consumer: "payments", Now: later})
		require.NoError(t, err)
		require.Len(t, stuck, 1)
		resolve := func(result []byte) error {
			return op.Resolve(t.Context(), repository.ResolveParams{
				Consumer: "payments", Key: stuck[0].Key, ExpectedOwner: stuck[0].LeaseOwner,
				Action: repository.ResolveComplete, Result: result, Now: later,
			})
		}
		for _, bad := range []string{"charged", "{}"} {
			require.ErrorIs(t, resolve([]byte(bad)), repository.ErrInvalidParams, "%q is not a stored result", bad)
		}
		paid := oddOutput()
		result, err := middleware.EncodeResult([]*message.Message{paid})
		require.NoError(t, err)
		require.NoError(t, resolve(result))

		replayed, err := h(msg)
		require.NoError(t, err)
		require.Len(t, replayed, 1)
		requireSameMessage(t, paid, replayed[0])
		decoded, err := middleware.DecodeResult(result)
		require.NoError(t, err)
		requireSameMessage(t, paid, decoded[0])
	})
}

func ExampleEncodeResult() {
	paid := message.NewMessage("payment-A-9", []byte(`{"status":"paid"}`))
	result, err := middleware.EncodeResult([]*message.Message{paid})
	if err != nil {
		panic(err)
	}
	// result goes into repository.ResolveParams.Result with ResolveComplete.
	msgs, err := middleware.DecodeResult(result)
	fmt.Println(msgs[0].UUID, string(msgs[0].Payload), err)
	// Output: payment-A-9 {"status":"paid"} <nil>
}
