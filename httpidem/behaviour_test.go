package httpidem_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// scenario is one row of the behaviour table in docs/http.md: the
// request, the state the key is in, and the response observed.
type scenario struct {
	request, state string
	// run prepares the state and sends the request; it returns the
	// response and how many times the handler ran for that request.
	run    func(t *testing.T, e *env) (reply, int)
	status int
}

type env struct {
	repo backends.TwoPhase
	shop *shop
	base string
	c    *http.Client
}

// last sends q and counts the handler runs it caused.
func (e *env) last(t *testing.T, q request) (reply, int) {
	before := e.shop.runs.Load()
	r := send(t, e.c, e.base, q)
	return r, int(e.shop.runs.Load() - before)
}

func post(key, body string) request {
	return request{method: "POST", path: "/orders", client: "alice", key: key, body: body}
}

var scenarios = []scenario{
	{"POST without Idempotency-Key", "—", func(t *testing.T, e *env) (reply, int) {
		return e.last(t, post("", "{}"))
	}, 400},
	{"POST with a malformed key (`\"abc`)", "—", func(t *testing.T, e *env) (reply, int) {
		return e.last(t, post(`"abc`, "{}"))
	}, 400},
	{"GET without key", "— (method not in Methods)", func(t *testing.T, e *env) (reply, int) {
		return e.last(t, request{method: "GET", path: "/orders", client: "alice"})
	}, 201},
	{"POST with key, no authenticated client", "—", func(t *testing.T, e *env) (reply, int) {
		return e.last(t, request{method: "POST", path: "/orders", key: "k", body: "{}"})
	}, 401},
	{"POST with key, body over MaxBodyBytes", "—", func(t *testing.T, e *env) (reply, int) {
		return e.last(t, post("k-big-body", strings.Repeat("x", 2048)))
	}, 413},
	{"POST with key K", "K unknown", func(t *testing.T, e *env) (reply, int) {
		return e.last(t, post("k1", `{"sku":1}`))
	}, 201},
	{"same POST with K again", "K completed with 201", func(t *testing.T, e *env) (reply, int) {
		first, _ := e.last(t, post("k2", `{"sku":1}`))
		r, n := e.last(t, post("k2", `{"sku":1}`))
		require.Equal(t, first.body, r.body, "the body is replayed")
		require.Equal(t, first.header.Get("Location"), r.header.Get("Location"), "allowed headers are replayed")
		require.Empty(t, r.header.Get("X-Run"), "headers outside ReplayHeaders are not")
		return r, n
	}, 201},
	{"POST with K, another body", "K completed", func(t *testing.T, e *env) (reply, int) {
		e.last(t, post("k3", `{"sku":1}`))
		return e.last(t, post("k3", `{"sku":2}`))
	}, 422},
	{"POST with K to another route", "K completed on /orders", func(t *testing.T, e *env) (reply, int) {
		e.last(t, post("k4", `{"sku":1}`))
		q := post("k4", `{"sku":1}`)
		q.path = "/refunds"
		return e.last(t, q)
	}, 201},
	{"POST with K from another client (same body)", "K completed for alice", func(t *testing.T, e *env) (reply, int) {
		alice, _ := e.last(t, post("k5", `{"sku":1}`))
		q := post("k5", `{"sku":1}`)
		q.client = "mallory"
		r, n := e.last(t, q)
		require.NotEqual(t, alice.body, r.body, "mallory must never get alice's response")
		require.Equal(t, "mallory", jsonField(t, r.body, "client"))
		return r, n
	}, 201},
	{"same POST with K", "K in flight", func(t *testing.T, e *env) (reply, int) {
		entered, release := e.shop.hold("k6")
		defer release()
		q := post("k6", `{}`)
		q.path = "/orders?block=k6"
		done := make(chan reply, 1)
		go func() { done <- send(t, e.c, e.base, q) }()
		<-entered
		r, n := e.last(t, q)
		release()
		require.Equal(t, 201, (<-done).status)
		return r, n
	}, 409},
	{"same POST with K", "K's handler answered 500", func(t *testing.T, e *env) (reply, int) {
		q := post("k7", `{}`)
		q.path = "/orders?status=500"
		first, _ := e.last(t, q)
		require.Equal(t, 500, first.status)
		return e.last(t, q)
	}, 500},
	{"same POST with K", "K's handler panicked", func(t *testing.T, e *env) (reply, int) {
		q := post("k8", `{}`)
		q.path = "/orders?panic=k8"          // panics on the first run only
		_, err := e.c.Do(q.build(t, e.base)) // the server aborts the connection
		require.Error(t, err)
		return e.last(t, q)
	}, 201},
	{"same POST with K", "K's handler answered 409", func(t *testing.T, e *env) (reply, int) {
		q := post("k9", `{}`)
		q.path = "/orders?status=409"
		e.last(t, q)
		return e.last(t, q)
	}, 409},
	{"same POST with K", "K's handler answered 400 (validation)", func(t *testing.T, e *env) (reply, int) {
		q := post("k10", `{}`)
		q.path = "/orders?status=400"
		e.last(t, q)
		return e.last(t, q)
	}, 400},
	{"same POST with K", "K's response was over MaxResponseBytes", func(t *testing.T, e *env) (reply, int) {
		q := post("k11", `{}`)
		q.path = "/orders?big=1"
		first, _ := e.last(t, q)
		require.Greater(t, len(first.body), 4096, "the big response passes through whole")
		return e.last(t, q)
	}, 201},
	{"same POST with K", "K's earlier request died mid-run (lease expired), OnExpiredLease: Intervene", func(t *testing.T, e *env) (reply, int) {
		return expired(t, e, "k12", idempotency.Intervene)
	}, 409},
	{"same POST with K", "K's earlier request died mid-run (lease expired), OnExpiredLease: Reclaim", func(t *testing.T, e *env) (reply, int) {
		return expired(t, e, "k13", idempotency.Reclaim)
	}, 201},
	{"POST with K", "store unavailable", func(t *testing.T, e *env) (reply, int) {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "closed.db"))
		require.NoError(t, err)
		repo, err := sqlite.NewRepository(db, sqlite.Config{})
		require.NoError(t, err)
		require.NoError(t, db.Close())
		s := newShop()
		srv := server(t, repo, s, httpidem.Config{})
		r := send(t, e.c, srv.URL, post("k14", `{}`))
		return r, int(s.runs.Load())
	}, 503},
}

// expired leaves key in progress under a lease that is already over: a
// server whose clock is an hour behind takes the request and hangs. Then
// the request comes again to a server with the given policy.
func expired(t *testing.T, e *env, key string, policy idempotency.ExpiredLeasePolicy) (reply, int) {
	hung := newShop()
	entered, release := hung.hold(key)
	defer release()
	hungSrv := server(t, e.repo, hung, httpidem.Config{Now: func() time.Time { return time.Now().Add(-time.Hour) }})
	q := post(key, `{}`)
	q.path = "/orders?block=" + key
	go func() {
		resp, err := e.c.Do(q.build(t, hungSrv.URL))
		if err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-entered
	s := newShop()
	_, releaseNew := s.hold(key)
	releaseNew() // the same request (same fingerprint) must not block here
	srv := server(t, e.repo, s, httpidem.Config{OnExpiredLease: policy})
	r := send(t, e.c, srv.URL, q)
	return r, int(s.runs.Load())
}

// describe renders the observed response for the table.
func describe(r reply, runs int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", r.status, http.StatusText(r.status))
	if title := r.problemTitle(); title != "" {
		fmt.Fprintf(&b, " — %q", title)
	}
	if ra := r.header.Get("Retry-After"); ra != "" {
		fmt.Fprintf(&b, ", `Retry-After: %s`", ra)
	}
	if r.header.Get(httpidem.HeaderReplayed) != "" {
		fmt.Fprintf(&b, ", `%s: %s` (stored status, headers, body)", httpidem.HeaderReplayed, r.header.Get(httpidem.HeaderReplayed))
	}
	if runs > 0 {
		b.WriteString("; handler runs")
	} else {
		b.WriteString("; handler does not run")
	}
	return b.String()
}

const (
	tableStart = "<!-- behaviour table: generated by TestBehaviourTable (UPDATE_DOCS=1 rewrites it) -->"
	tableEnd   = "<!-- end of behaviour table -->"
)

// TestBehaviourTable runs every scenario on every backend and checks the
// table in docs/http.md against what the memory backend answered.
func TestBehaviourTable(t *testing.T) {
	rows := make([]string, len(scenarios))
	// The subtests are parallel: they end after this function returns,
	// before its cleanups run.
	t.Cleanup(func() { checkTable(t, rows) })
	backends.ForEach(t, nil, func(t *testing.T, st *backends.Store) {
		for i, sc := range scenarios {
			t.Run(fmt.Sprintf("%02d", i), func(t *testing.T) {
				e := &env{repo: st.Repo, shop: newShop(), c: &http.Client{Timeout: 30 * time.Second}}
				e.base = server(t, st.Repo, e.shop, httpidem.Config{}).URL
				r, runs := sc.run(t, e)
				require.Equal(t, sc.status, r.status, "%s / %s: %s", sc.request, sc.state, r.body)
				if st.Name == "memory" {
					rows[i] = fmt.Sprintf("| %s | %s | %s |", sc.request, sc.state, describe(r, runs))
				}
			})
		}
	})
}

func checkTable(t *testing.T, rows []string) {
	if t.Failed() || rows[0] == "" { // failed, or memory did not run
		return
	}
	table := tableStart + "\n\n| request | state of the key | response |\n|---|---|---|\n" + strings.Join(rows, "\n") + "\n\n" + tableEnd
	path := filepath.Join("..", "docs", "http.md")
	doc, err := os.ReadFile(path)
	require.NoError(t, err)
	start, end := strings.Index(string(doc), tableStart), strings.Index(string(doc), tableEnd)
	require.True(t, start >= 0 && end > start, "docs/http.md has no behaviour table markers")
	current := string(doc[start : end+len(tableEnd)])
	if os.Getenv("UPDATE_DOCS") == "1" {
		updated := string(doc[:start]) + table + string(doc[end+len(tableEnd):])
		require.NoError(t, os.WriteFile(path, []byte(updated), 0o644))
		return
	}
	require.Equal(t, table, current, "docs/http.md's behaviour table differs from the tests; run UPDATE_DOCS=1 go test -run TestBehaviourTable ./httpidem/")
}
