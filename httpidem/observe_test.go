package httpidem_test

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/tracetest"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/tracing"
)

// TestMetricsAndSpans sends one request per outcome and checks that the
// Observer (metrics.Metrics in production) receives each under consumer
// "orders-api" (its Namespace), with its outcome, and that the tracing
// Observer beside it gives every request one span with the inbox's
// attributes, a child of the client's trace.
func TestMetricsAndSpans(t *testing.T) {
	m := &deliveries{}
	tp := tracetest.NewRecorder()

	s := newShop()
	srv := server(t, memory.NewRepository(), s, httpidem.Config{Observer: idempotency.Observers(m, tracing.New(tp))})
	c := srv.Client()

	entered, release := s.hold("slow")
	inFlight := make(chan reply, 1)
	go func() {
		inFlight <- send(t, c, srv.URL, request{"POST", "/orders?block=slow", "alice", "k-slow", "{}"})
	}()
	<-entered

	for _, q := range []struct {
		req    request
		status int
	}{
		{request{"POST", "/orders", "alice", "k-1", `{"n":1}`}, 201},          // processed
		{request{"POST", "/orders", "alice", "k-1", `{"n":1}`}, 201},          // replayed
		{request{"POST", "/orders", "alice", "k-1", `{"n":2}`}, 422},          // payload_mismatch
		{request{"POST", "/orders", "alice", "", `{}`}, 400},                  // no_key
		{request{"POST", "/orders", "", "k-2", `{}`}, 401},                    // no_scope
		{request{"POST", "/orders?status=500", "alice", "k-3", `{}`}, 500},    // failed: not stored
		{request{"POST", "/orders?block=slow", "alice", "k-slow", `{}`}, 409}, // lease_busy
		{request{"GET", "/orders", "alice", "", ``}, 201},                     // not idempotent: unobserved
	} {
		req := q.req.build(t, srv.URL)
		if q.req.key == "k-1" {
			// The client's trace continues in the middleware's span.
			ctx, span := tp.Tracer("client").Start(context.Background(), "client call")
			span.End()
			propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, q.status, resp.StatusCode, "%+v", q.req)
	}
	release()
	require.Equal(t, 201, (<-inFlight).status)

	require.Equal(t, map[string]int{
		"orders-api failed": 1, "orders-api lease_busy": 1, "orders-api no_key": 1, "orders-api no_scope": 1,
		"orders-api payload_mismatch": 1, "orders-api processed": 2, "orders-api replayed": 1,
	}, m.counts())

	spans := tp.Ended()
	byOutcome := map[string][]*tracetest.Span{}
	for _, sp := range spans {
		if !strings.HasPrefix(sp.Name(), "idempotency ") {
			continue
		}
		attrs := attribute.NewSet(sp.Attributes()...)
		outcome, _ := attrs.Value("idempotency.outcome")
		byOutcome[outcome.AsString()] = append(byOutcome[outcome.AsString()], sp)
		mode, _ := attrs.Value("idempotency.mode")
		require.Equal(t, "http", mode.AsString())
		consumer, _ := attrs.Value("idempotency.consumer")
		require.Equal(t, "orders-api", consumer.AsString())
		require.Equal(t, "idempotency POST /orders", sp.Name())
	}
	require.Len(t, byOutcome["processed"], 2)
	require.Len(t, byOutcome["replayed"], 1)
	require.Len(t, byOutcome["failed"], 1)
	require.Len(t, byOutcome["lease_busy"], 1)
	require.Len(t, byOutcome["payload_mismatch"], 1)
	require.Len(t, byOutcome["no_key"], 1)
	require.Len(t, byOutcome["no_scope"], 1)

	replayed := byOutcome["replayed"][0]
	attrs := attribute.NewSet(replayed.Attributes()...)
	key, _ := attrs.Value("idempotency.key")
	require.Equal(t, "k-1", key.AsString())
	status, _ := attrs.Value("http.response.status_code")
	require.EqualValues(t, 201, status.AsInt64())
	require.True(t, replayed.Parent().IsValid(), "the span continues the client's trace")
	require.Equal(t, codes.Unset, replayed.Status().Code)
	require.Equal(t, codes.Error, byOutcome["failed"][0].Status().Code)
	require.Equal(t, trace.SpanKindInternal, replayed.SpanKind())
}

// TestHandlerSpanIsChildOfMiddlewareSpan checks that the handler runs in
// the middleware's span, so its own spans nest under it.
func TestHandlerSpanIsChildOfMiddlewareSpan(t *testing.T) {
	tp := tracetest.NewRecorder()
	idem, err := httpidem.New(httpidem.Config{Repository: memory.NewRepository(), Namespace: "orders-api", Global: true, Observer: tracing.New(tp)})
	require.NoError(t, err)
	var inHandler trace.SpanContext
	h := idem.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inHandler = trace.SpanContextFromContext(r.Context())
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	resp := send(t, srv.Client(), srv.URL, request{method: "POST", path: "/", key: "k"})
	require.Equal(t, http.StatusCreated, resp.status)
	spans := tp.Ended()
	require.Len(t, spans, 1)
	require.Equal(t, spans[0].SpanContext().SpanID(), inHandler.SpanID())
}

// deliveries is a idempotency.Observer that counts deliveries by consumer
// and outcome; the metrics module's tests check what metrics.Metrics
// makes of them.
type deliveries struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *deliveries) ObserveDelivery(_ context.Context, x idempotency.Delivery) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[x.Scope+" "+string(x.Outcome)]++
}

func (d *deliveries) counts() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.n)
}

// TestObserverPanicDoesNotFailTheRequest: an Observer panicking in
// StartDelivery or ObserveDelivery changes nothing for the request: the
// response is the handler's, then the replay.
func TestObserverPanicDoesNotFailTheRequest(t *testing.T) {
	for _, where := range []string{"start", "observe"} {
		t.Run(where, func(t *testing.T) {
			obs := &backends.Lifecycle{PanicOnStart: where == "start", PanicOnObserve: where == "observe"}
			srv := server(t, memory.NewRepository(), newShop(), httpidem.Config{Observer: obs})
			first := send(t, srv.Client(), srv.URL, request{"POST", "/orders", "alice", "k-1", `{"n":1}`})
			require.Equal(t, http.StatusCreated, first.status)
			again := send(t, srv.Client(), srv.URL, request{"POST", "/orders", "alice", "k-1", `{"n":1}`})
			require.Equal(t, http.StatusCreated, again.status)
			require.Equal(t, "true", again.header.Get(httpidem.HeaderReplayed))
			require.Equal(t, 2, obs.Started())
			require.Equal(t, []idempotency.Outcome{idempotency.OutcomeProcessed, idempotency.OutcomeReplayed}, obs.Outcomes())
		})
	}
}
