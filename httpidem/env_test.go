package httpidem_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/repository"
)

// shop is the service under test: POST /orders creates an order, and the
// query string makes the handler misbehave on demand.
type shop struct {
	runs     atomic.Int32
	mu       sync.Mutex
	blocked  map[string]chan struct{} // ?block=name: entered signal
	release  map[string]chan struct{}
	panicked map[string]int // ?panic=name: panic on the first run only
	// onServe, if set, runs at the start of every request.
	onServe atomic.Pointer[func()]
}

func newShop() *shop {
	return &shop{blocked: map[string]chan struct{}{}, release: map[string]chan struct{}{}, panicked: map[string]int{}}
}

// hold makes requests with ?block=name wait until the returned func runs;
// entered is closed when one is inside the handler.
func (s *shop) hold(name string) (entered <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, out := make(chan struct{}), make(chan struct{})
	s.blocked[name], s.release[name] = in, out
	var once sync.Once
	return in, func() { once.Do(func() { close(out) }) }
}

func (s *shop) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f := s.onServe.Load(); f != nil {
		(*f)()
	}
	n := s.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	q := r.URL.Query()
	if name := q.Get("block"); name != "" {
		s.mu.Lock()
		in, out := s.blocked[name], s.release[name]
		s.mu.Unlock()
		close(in)
		<-out
	}
	if name := q.Get("panic"); name != "" {
		s.mu.Lock()
		first := s.panicked[name] == 0
		s.panicked[name]++
		s.mu.Unlock()
		if first {
			panic("handler panicked")
		}
	}
	status := http.StatusCreated
	if v := q.Get("status"); v != "" {
		status, _ = strconv.Atoi(v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("X-Run", strconv.Itoa(int(n))) // not replayed
	w.WriteHeader(status)
	resp := map[string]any{"order": n, "client": r.Header.Get("X-Client"), "body": string(body)}
	if q.Get("big") != "" {
		resp["padding"] = strings.Repeat("x", 4096)
	}
	_ = json.NewEncoder(w).Encode(resp)
}

func principal(r *http.Request) (string, error) {
	if c := r.Header.Get("X-Client"); c != "" {
		return c, nil
	}
	return "", errors.New("unauthenticated")
}

// server serves the shop behind the middleware configured by cfg.
func server(t *testing.T, repo repository.TwoPhase, s *shop, cfg httpidem.Config) *httptest.Server {
	t.Helper()
	srv, _ := serverWith(t, repo, s, cfg)
	return srv
}

// serverWith is server, also returning the middleware.
func serverWith(t *testing.T, repo repository.TwoPhase, s *shop, cfg httpidem.Config) (*httptest.Server, *httpidem.Idempotency) {
	t.Helper()
	cfg.Repository = repo
	if cfg.Namespace == "" {
		cfg.Namespace = "orders-api"
	}
	if cfg.Principal == nil && !cfg.Global {
		cfg.Principal = principal
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = 1024
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1024
	}
	idem, err := httpidem.New(cfg)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idem.Middleware(s))
	mux.Handle("POST /refunds", idem.Middleware(s))
	mux.Handle("GET /orders", idem.Middleware(s))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, idem
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) problemTitle() string {
	var p struct{ Title string }
	if r.header.Get("Content-Type") == "application/problem+json" {
		_ = json.Unmarshal([]byte(r.body), &p)
	}
	return p.Title
}

// request describes one call.
type request struct {
	method, path, client, key, body string
}

func (q request) build(t testing.TB, base string) *http.Request {
	req, err := http.NewRequest(q.method, base+q.path, strings.NewReader(q.body))
	require.NoError(t, err)
	if q.client != "" {
		req.Header.Set("X-Client", q.client)
	}
	if q.key != "" {
		req.Header.Set(httpidem.HeaderKey, q.key)
	}
	return req
}

func send(t testing.TB, client *http.Client, base string, q request) reply {
	t.Helper()
	resp, err := client.Do(q.build(t, base))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// sendWithRetries is a client that retries like a careful one does: on
// a transport error (a timeout) and on 409 or 503 after Retry-After,
// with the same Idempotency-Key, up to attempts times.
func sendWithRetries(t testing.TB, client *http.Client, base string, q request, attempts int) (reply, int) {
	t.Helper()
	var last error
	for i := 1; i <= attempts; i++ {
		resp, err := client.Do(q.build(t, base))
		if err != nil {
			last = err
			continue
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			last = err
			continue
		}
		r := reply{resp.StatusCode, resp.Header, string(b)}
		if r.status == http.StatusConflict || r.status == http.StatusServiceUnavailable {
			if ra := r.header.Get("Retry-After"); ra != "" {
				secs, _ := strconv.Atoi(ra)
				time.Sleep(time.Duration(secs) * time.Second) // what Retry-After asks of the client
				continue
			}
		}
		return r, i
	}
	t.Fatalf("no answer after %d attempts: %v", attempts, last)
	return reply{}, attempts
}

func jsonField(t testing.TB, body, field string) any {
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &m), body)
	return m[field]
}
