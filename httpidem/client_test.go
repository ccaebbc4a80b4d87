package httpidem_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

var errTransient = errors.New("transient")

// The key reaches a downstream HTTP API as Idempotency-Key, derived per
// call, identical on a re-run after a failure.
func TestTransportSetsHeader(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get(httpidem.HeaderKey))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &httpidem.Transport{}}

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
				reqCtx = httpidem.WithName(reqCtx, ctx.name)
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

	charge := idempotency.Derive("order-1", "charge-card")
	require.Equal(t, []string{"order-1", charge, "order-1", charge}, seen)

	// Outside a handler, or with the header already set, nothing changes.
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Set(httpidem.HeaderKey, "caller-set")
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
