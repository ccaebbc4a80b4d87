package once_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// Every call is reported to the Observer as a delivery of consumer Scope,
// with the inboxes' outcomes, so one metrics value counts them too.
func TestObserverReportsEveryCall(t *testing.T) {
	seen := &backends.Deliveries{}
	o, err := once.NewTwoPhase(once.TwoPhaseConfig{Repository: memory.NewRepository(), Scope: "nightly-export", Observer: seen})
	require.NoError(t, err)
	ok := func(context.Context) ([]byte, error) { return []byte("done"), nil }
	boom := errors.New("boom")

	_, err = o.DoInput(t.Context(), "k", []byte("a"), ok)
	require.NoError(t, err)
	_, err = o.DoInput(t.Context(), "k", []byte("a"), ok)
	require.NoError(t, err)
	_, err = o.DoInput(t.Context(), "k", []byte("b"), ok)
	require.ErrorIs(t, err, idempotency.ErrPayloadMismatch)
	_, err = o.Do(t.Context(), "other", func(context.Context) ([]byte, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	_, err = o.Do(t.Context(), "", ok)
	require.ErrorIs(t, err, once.ErrNoKey)

	require.Equal(t, []idempotency.Outcome{
		idempotency.OutcomeProcessed, idempotency.OutcomeReplayed, idempotency.OutcomePayloadMismatch,
		idempotency.OutcomeFailed, idempotency.OutcomeNoKey,
	}, seen.Outcomes())
	all := seen.All()
	for _, d := range all {
		require.Equal(t, "nightly-export", d.Scope)
	}
	require.Equal(t, "k", all[0].Key)
	require.ErrorIs(t, all[3].Err, boom)
}

// callRecovered runs call and returns what it panicked with, if it did.
func callRecovered(call func()) (panicked any) {
	defer func() { panicked = recover() }()
	call()
	return nil
}

// TestPanicIsObservedInBothModes: a function's panic ends the call for
// the observer (failed) before it is raised again, in both modes, and
// leaves nothing stored: the next call runs the function.
func TestPanicIsObservedInBothModes(t *testing.T) {
	backends.ForEach(t, []string{"sqlite", "postgres"}, func(t *testing.T, s *backends.Store) {
		obs := &backends.Lifecycle{}
		tx, err := once.NewTransactional(s.SQL, once.Config{Scope: backends.RandomName("etl"), Observer: obs})
		require.NoError(t, err)
		two, err := once.NewTwoPhase(once.TwoPhaseConfig{Repository: s.SQL, Scope: backends.RandomName("etl"), Observer: obs})
		require.NoError(t, err)

		require.Equal(t, "bug", callRecovered(func() {
			_, _ = tx.Do(t.Context(), "k", func(context.Context, *sql.Tx) ([]byte, error) { panic("bug") })
		}))
		require.Equal(t, "bug", callRecovered(func() {
			_, _ = two.Do(t.Context(), "k", func(context.Context) ([]byte, error) { panic("bug") })
		}))
		require.Equal(t, 2, obs.Started())
		require.Equal(t, []idempotency.Outcome{idempotency.OutcomeFailed, idempotency.OutcomeFailed}, obs.Outcomes())

		res, err := tx.Do(t.Context(), "k", func(context.Context, *sql.Tx) ([]byte, error) { return []byte("ran"), nil })
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("ran")}, res)
		res, err = two.Do(t.Context(), "k", func(context.Context) ([]byte, error) { return []byte("ran"), nil })
		require.NoError(t, err)
		require.Equal(t, once.Result{Value: []byte("ran")}, res)
	})
}

// TestObserverPanicDoesNotFailTheCall: an observer panicking in
// StartDelivery or ObserveDelivery changes nothing for the call.
func TestObserverPanicDoesNotFailTheCall(t *testing.T) {
	for _, where := range []string{"start", "observe"} {
		t.Run(where, func(t *testing.T) {
			obs := &backends.Lifecycle{PanicOnStart: where == "start", PanicOnObserve: where == "observe"}
			o, err := once.NewTwoPhase(once.TwoPhaseConfig{Repository: memory.NewRepository(), Scope: "jobs", Observer: obs})
			require.NoError(t, err)
			var res once.Result
			require.Nil(t, callRecovered(func() {
				res, err = o.Do(t.Context(), "k", func(context.Context) ([]byte, error) { return []byte("ran"), nil })
			}))
			require.NoError(t, err)
			require.Equal(t, once.Result{Value: []byte("ran")}, res)
			require.Nil(t, callRecovered(func() {
				res, err = o.Do(t.Context(), "k", func(context.Context) ([]byte, error) { return []byte("again"), nil })
			}))
			require.NoError(t, err)
			require.Equal(t, once.Result{Value: []byte("ran"), Replayed: true}, res)
			require.Equal(t, 2, obs.Started())
			require.Len(t, obs.All(), 2)
		})
	}
}
