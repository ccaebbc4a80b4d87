package httpidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
)

// sendUntilSettled sends q again while the answer is 409 in flight, as a
// client honouring Retry-After does (polling faster, with a deadline).
func sendUntilSettled(t *testing.T, client *http.Client, base string, q request) reply {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := send(t, client, base, q)
		if r.status != http.StatusConflict || r.header.Get("Retry-After") == "" || time.Now().After(deadline) {
			return r
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCompleteFailingOnce: one dropped connection while the response is
// stored must neither charge the client twice (Reclaim) nor answer 409
// needs-intervention forever for a request that succeeded (Intervene):
// the retry gets the first response replayed.
func TestCompleteFailingOnce(t *testing.T) {
	for _, policy := range []idempotency.ExpiredLeasePolicy{idempotency.Intervene, idempotency.Reclaim} {
		for _, lostAnswer := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/lost-answer=%t", policy, lostAnswer), func(t *testing.T) {
				t.Parallel()
				backends.ForEach(t, retryBackends, func(t *testing.T, st *backends.Store) {
					repo := &backends.Faulty{TwoPhase: st.Repo, CommitFirst: lostAnswer}
					repo.FailComplete.Store(1)
					s := newShop()
					seen := &backends.Deliveries{}
					srv := server(t, repo, s, httpidem.Config{Lease: 5 * time.Second, OnExpiredLease: policy, Observer: seen})
					client := &http.Client{Timeout: 30 * time.Second}
					q := post("pay-1", `{"amount":100}`)

					first := send(t, client, srv.URL, q)
					again := sendUntilSettled(t, client, srv.URL, q)
					require.EqualValues(t, 1, s.runs.Load(), "the payment ran exactly once")
					require.Equal(t, http.StatusCreated, first.status)
					require.Equal(t, http.StatusCreated, again.status, "replayed, not %d %s", again.status, again.problemTitle())
					require.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
					require.Equal(t, first.body, again.body)
					require.Equal(t, first.header.Get("Location"), again.header.Get("Location"))
					require.Equal(t, idempotency.OutcomeProcessed, seen.Outcomes()[0], "the first response is stored")
					// A retry; unless the first committed: the lease extension
					// before the retry then finds the record completed, by this call.
					wantCompletes := 2
					if lostAnswer {
						wantCompletes = 1
					}
					require.EqualValues(t, wantCompletes, repo.Completes.Load())
				})
			})
		}
	}
}

// TestHungExtensionDoesNotHoldTheResponse: an extension hanging when the
// handler returns is abandoned; the client gets the response within
// StoreTimeout of the handler's end, not when the store answers.
func TestHungExtensionDoesNotHoldTheResponse(t *testing.T) {
	backends.ForEach(t, []string{"memory"}, func(t *testing.T, st *backends.Store) {
		const (
			lease        = 3 * time.Second
			storeTimeout = lease / 3 // the default
		)
		repo := &backends.Faulty{TwoPhase: st.Repo, ExtendHang: 30 * time.Second}
		var handlerEnd atomic.Int64 // UnixNano
		idem, err := httpidem.New(httpidem.Config{
			Repository: repo, Namespace: "orders-api", Global: true,
			Lease: lease, ExtendEvery: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		srv := httptest.NewServer(idem.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			// Return while an extension hangs, or this test proves nothing.
			deadline := time.Now().Add(30 * time.Second)
			for repo.ExtendsStarted.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			handlerEnd.Store(time.Now().UnixNano())
			w.WriteHeader(http.StatusCreated)
		})))
		t.Cleanup(srv.Close)

		r := send(t, &http.Client{Timeout: time.Minute}, srv.URL, request{method: "POST", path: "/", key: "k", body: "{}"})
		waited := time.Since(time.Unix(0, handlerEnd.Load()))
		t.Logf("response %s after the handler returned, with an extension hanging %s", waited.Round(time.Millisecond), repo.ExtendHang)
		require.Equal(t, http.StatusCreated, r.status)
		require.Positive(t, repo.ExtendsStarted.Load())
		// Generous for a loaded machine, far below the hang.
		require.Less(t, waited, 10*storeTimeout, "the response waited for the hung extension")
	})
}
