package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

func TestDeriveIsStableAndDistinct(t *testing.T) {
	a := middleware.Derive("order-1", "charge-card")
	require.Equal(t, a, middleware.Derive("order-1", "charge-card"), "stable across calls")
	_, err := uuid.Parse(a)
	require.NoError(t, err, "a UUID, accepted by APIs that limit key formats")
	require.NotEqual(t, a, middleware.Derive("order-1", "send-email"))
	require.NotEqual(t, a, middleware.Derive("order-2", "charge-card"))
	require.NotEqual(t, middleware.Derive("a:b", "c"), middleware.Derive("a", "b:c"))
	// A pinned value: changing the derivation would break every stored
	// downstream key, so it must not change silently.
	require.Equal(t, "29a1c490-3ca3-58c1-a0ed-6e55474649fb", a)
	require.Equal(t, "dc9f93a8-af80-57d4-831c-5a6313d2cbe8", middleware.OutputUUID("billing", "k", 0))

	require.Equal(t, middleware.OutputUUID("billing", "k", 0), middleware.OutputUUID("billing", "k", 0))
	require.NotEqual(t, middleware.OutputUUID("billing", "k", 0), middleware.OutputUUID("billing", "k", 1))
	require.NotEqual(t, middleware.OutputUUID("billing", "k", 0), middleware.OutputUUID("shipping", "k", 0))
}

// The key reaches a downstream HTTP API as Idempotency-Key, derived per
// call, identical on a re-run after a failure.
func TestIdempotencyTransportSetsHeader(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(middleware.IdempotencyKeyHeader))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &middleware.IdempotencyTransport{}}

	inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: memory.NewRepository(), Consumer: "payments"})
	require.NoError(t, err)
	attempt := 0
	mw := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		attempt++
		for _, ctx := range []struct {
			name string
		}{{""}, {"charge-card"}} {
			reqCtx := msg.Context()
			if ctx.name != "" {
				reqCtx = middleware.WithIdempotencyName(reqCtx, ctx.name)
			}
			req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, srv.URL, nil)
			require.NoError(t, err)
			resp, err := client.Do(req)
			require.NoError(t, err)
			_ = resp.Body.Close()
		}
		if attempt == 1 {
			return nil, errTransient // the retry must send the same keys
		}
		return nil, nil
	})
	_, err = mw(message.NewMessage("order-1", nil))
	require.ErrorIs(t, err, errTransient)
	_, err = mw(message.NewMessage("order-1", nil))
	require.NoError(t, err)

	charge := middleware.Derive("order-1", "charge-card")
	require.Equal(t, []string{"order-1", charge, "order-1", charge}, seen)

	// Outside a handler, or with the header already set, nothing changes.
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set(middleware.IdempotencyKeyHeader, "caller-set")
	resp, err := client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	req, err = http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	resp, err = client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, []string{"caller-set", ""}, seen[4:])
}

var errTransient = errorString("transient")

type errorString string

func (e errorString) Error() string { return string(e) }
