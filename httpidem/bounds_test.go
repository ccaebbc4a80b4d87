package httpidem_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// TestStoreThatStopsAnsweringHoldsNoRequest: a store whose every call
// hangs until its context ends holds a request for at most 3 ×
// StoreTimeout besides the handler's time: 503 when it hangs from the
// claim on, and the handler's response when it hangs after the claim
// (the response is stored in the background; once the store answers, a
// retry gets it replayed).
func TestStoreThatStopsAnsweringHoldsNoRequest(t *testing.T) {
	const storeTimeout = 500 * time.Millisecond
	bound := 3 * storeTimeout
	setup := func(t *testing.T, s *shop) (*backends.Hanging, *httpidem.Idempotency, string) {
		repo := &backends.Hanging{TwoPhase: memory.NewRepository()}
		srv, idem := serverWith(t, repo, s, httpidem.Config{
			Lease: 3 * time.Second, StoreTimeout: storeTimeout,
			FinishRetry: idempotency.FinishRetry{MaxAttempts: 50, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		})
		return repo, idem, srv.URL
	}
	drain := func(t *testing.T, idem *httpidem.Idempotency) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		require.NoError(t, idem.Drain(ctx))
	}
	client := &http.Client{Timeout: 10 * bound}

	t.Run("from the claim on", func(t *testing.T) {
		repo, idem, url := setup(t, newShop())
		repo.Hang.Store(true)
		start := time.Now()
		r := send(t, client, url, request{"POST", "/orders", "alice", "k-1", `{"n":1}`})
		require.Less(t, time.Since(start), bound)
		require.Equal(t, http.StatusServiceUnavailable, r.status)
		repo.Hang.Store(false)
		drain(t, idem)
		r = send(t, client, url, request{"POST", "/orders", "alice", "k-1", `{"n":1}`})
		require.Equal(t, http.StatusCreated, r.status)
	})

	t.Run("after the claim", func(t *testing.T) {
		s := newShop()
		repo, idem, url := setup(t, s)
		hang := func() { repo.Hang.Store(true) }
		s.onServe.Store(&hang)
		start := time.Now()
		r := send(t, client, url, request{"POST", "/orders", "alice", "k-1", `{"n":1}`})
		require.Less(t, time.Since(start), bound)
		require.Equal(t, http.StatusCreated, r.status, "the handler's response goes out")
		s.onServe.Store(nil)
		repo.Hang.Store(false)
		drain(t, idem)
		r = send(t, client, url, request{"POST", "/orders", "alice", "k-1", `{"n":1}`})
		require.Equal(t, http.StatusCreated, r.status)
		require.Equal(t, "true", r.header.Get(httpidem.HeaderReplayed), "stored in the background")
	})
}
