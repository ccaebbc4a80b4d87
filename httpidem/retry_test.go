package httpidem_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
)

var retryBackends = []string{"memory", "postgres", "redis"}

// N identical requests at once: the handler runs exactly once; every
// other request answers 409 (in flight) or the replay.
func TestConcurrentIdenticalRequests(t *testing.T) {
	backends.ForEach(t, retryBackends, func(t *testing.T, st *backends.Store) {
		s := newShop()
		srv := server(t, st.Repo, s, httpidem.Config{})
		const n = 16
		client := &http.Client{Timeout: 30 * time.Second}
		replies := make([]reply, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				replies[i] = send(t, client, srv.URL, post("same", `{"sku":7}`))
			}()
		}
		close(start)
		wg.Wait()
		require.EqualValues(t, 1, s.runs.Load())
		fresh, replayed, busy := 0, 0, 0
		for _, r := range replies {
			switch {
			case r.status == http.StatusConflict:
				require.Equal(t, "1", r.header.Get("Retry-After"))
				busy++
			case r.status == http.StatusCreated && r.header.Get(httpidem.HeaderReplayed) == "true":
				require.EqualValues(t, 1, jsonField(t, r.body, "order"))
				replayed++
			case r.status == http.StatusCreated:
				fresh++
			default:
				t.Fatalf("unexpected reply %d %s", r.status, r.body)
			}
		}
		require.Equal(t, 1, fresh)
		t.Logf("%s: %d requests: 1 ran, %d replayed, %d answered 409", st.Name, n, replayed, busy)
	})
}

// Clients that retry (after a timeout, and after 409 as Retry-After
// says) with the same key all end with the one order.
func TestClientsWithRetriesGetOneOrder(t *testing.T) {
	backends.ForEach(t, retryBackends, func(t *testing.T, st *backends.Store) {
		s := newShop()
		srv := server(t, st.Repo, s, httpidem.Config{})
		entered, release := s.hold("slow")
		q := post("retried", `{"sku":9}`)
		q.path = "/orders?block=slow"

		// The first client times out while the handler is still running, as
		// a client behind a slow network does, and retries.
		impatient := &http.Client{Timeout: 200 * time.Millisecond}
		_, err := impatient.Do(q.build(t, srv.URL))
		require.Error(t, err, "the first attempt times out")
		<-entered

		const n = 4
		conflict := make(chan struct{})
		var once sync.Once
		client := &http.Client{Timeout: 30 * time.Second, Transport: onStatus{http.StatusConflict, func() { once.Do(func() { close(conflict) }) }}}
		replies := make([]reply, n)
		attempts := make([]int, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i], attempts[i] = sendWithRetries(t, client, srv.URL, q, 30)
			}()
		}
		<-conflict // a retry met the running request (409, Retry-After: 1)
		release()
		wg.Wait()
		require.EqualValues(t, 1, s.runs.Load(), "one order, however often the clients retried")
		for i, r := range replies {
			require.Equal(t, http.StatusCreated, r.status, r.body)
			require.Equal(t, "true", r.header.Get(httpidem.HeaderReplayed))
			require.EqualValues(t, 1, jsonField(t, r.body, "order"))
			require.Equal(t, "/orders/1", r.header.Get("Location"))
			require.GreaterOrEqual(t, attempts[i], 1)
		}
		t.Logf("%s: attempts per client %v", st.Name, attempts)
	})
}

// Config without a principal is refused unless explicitly global.
func TestPrincipalRequired(t *testing.T) {
	st := backends.Open(t, "memory")
	_, err := httpidem.New(httpidem.Config{Repository: st.Repo, Namespace: "orders-api"})
	require.ErrorContains(t, err, "missing Config.Principal")
	_, err = httpidem.New(httpidem.Config{Repository: st.Repo, Namespace: "orders-api", Global: true})
	require.NoError(t, err)
	_, err = httpidem.New(httpidem.Config{Repository: st.Repo, Namespace: "orders-api", Global: true, Principal: principal})
	require.ErrorContains(t, err, "exclusive")
}

// Config without a Namespace is refused: two services sharing a table
// would replay each other's responses. An invalid one is refused too.
func TestNamespaceRequired(t *testing.T) {
	st := backends.Open(t, "memory")
	_, err := httpidem.New(httpidem.Config{Repository: st.Repo, Global: true})
	require.ErrorContains(t, err, "missing Config.Namespace")
	require.NotContains(t, err.Error(), "Scope", "the error names httpidem's field, not once's")
	_, err = httpidem.New(httpidem.Config{Repository: st.Repo, Global: true, Namespace: "orders\x00api"})
	require.ErrorContains(t, err, "config.Namespace contains a NUL byte")
	_, err = httpidem.New(httpidem.Config{Repository: st.Repo, Global: true, Namespace: "orders-api"})
	require.NoError(t, err)
}

// onStatus is a client transport that calls fn when a response has the
// given status.
type onStatus struct {
	status int
	fn     func()
}

func (o onStatus) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err == nil && resp.StatusCode == o.status {
		o.fn()
	}
	return resp, err
}

// Validate checks the lease settings (and Methods) itself, with once's rules, so a
// Config that New would refuse never passes Validate.
func TestValidateChecksLease(t *testing.T) {
	st := backends.Open(t, "memory")
	for name, tc := range map[string]struct {
		config httpidem.Config
		want   string
	}{
		"extend not shorter than lease":        {httpidem.Config{Lease: time.Minute, ExtendEvery: time.Minute, Retention: time.Hour}, "ExtendEvery must be positive and shorter than Lease"},
		"negative lease":                       {httpidem.Config{Lease: -time.Second, ExtendEvery: time.Second, Retention: time.Hour}, "Lease must be positive"},
		"retention not longer than lease":      {httpidem.Config{Lease: time.Hour, ExtendEvery: time.Minute, Retention: time.Hour}, "Retention (1h0m0s) must be longer than Lease"},
		"store timeout not shorter than lease": {httpidem.Config{Lease: time.Minute, ExtendEvery: time.Second, StoreTimeout: time.Minute, Retention: time.Hour}, "StoreTimeout must be positive and shorter than Lease"},
		"negative finish attempts": {httpidem.Config{Lease: time.Minute, ExtendEvery: time.Second, StoreTimeout: time.Second, Retention: time.Hour,
			FinishRetry: idempotency.FinishRetry{MaxAttempts: -1, InitialInterval: time.Second, MaxInterval: time.Second}}, "FinishRetry.MaxAttempts must be at least 1"},
		"method not a token": {httpidem.Config{Methods: []string{"POST\nX"}}, `config.Methods: "POST\nX" is not an upper-case method`},
	} {
		t.Run(name, func(t *testing.T) {
			c := tc.config
			c.Repository, c.Global = st.Repo, true
			if c.Methods == nil {
				c.Methods = httpidem.DefaultMethods
			}
			c.Namespace, c.MaxKeyLength, c.MaxBodyBytes, c.MaxResponseBytes = "orders-api", 64, 1, 1
			require.ErrorContains(t, c.Validate(), tc.want)
			_, err := httpidem.New(c)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
