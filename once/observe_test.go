package once_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/backends"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// Every call is reported to the Observer as a delivery of consumer Scope,
// with the inboxes' outcomes, so one metrics value counts them too.
func TestObserverReportsEveryCall(t *testing.T) {
	seen := &backends.Deliveries{}
	o, err := once.NewTwoPhase(once.Config{Repository: memory.NewRepository(), Scope: "nightly-export", Observer: seen})
	require.NoError(t, err)
	ok := func(context.Context) ([]byte, error) { return []byte("done"), nil }
	boom := errors.New("boom")

	_, err = o.DoInput(t.Context(), "k", []byte("a"), ok)
	require.NoError(t, err)
	_, err = o.DoInput(t.Context(), "k", []byte("a"), ok)
	require.NoError(t, err)
	_, err = o.DoInput(t.Context(), "k", []byte("b"), ok)
	require.ErrorIs(t, err, middleware.ErrPayloadMismatch)
	_, err = o.Do(t.Context(), "other", func(context.Context) ([]byte, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	_, err = o.Do(t.Context(), "", ok)
	require.ErrorIs(t, err, once.ErrNoKey)

	require.Equal(t, []middleware.Outcome{
		middleware.OutcomeProcessed, middleware.OutcomeReplayed, middleware.OutcomePayloadMismatch,
		middleware.OutcomeFailed, middleware.OutcomeNoKey,
	}, seen.Outcomes())
	all := seen.All()
	for _, d := range all {
		require.Equal(t, "nightly-export", d.Consumer)
	}
	require.Equal(t, "k", all[0].Key)
	require.ErrorIs(t, all[3].Err, boom)
}
