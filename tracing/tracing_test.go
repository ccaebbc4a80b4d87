package tracing_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/tracetest"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
	"github.com/idemkit/watermill-idempotent/tracing"
)

// entry runs one delivery of key through an entry point observed by obs,
// in the trace of parent; work runs in the handler's context.
type entry func(t *testing.T, obs idempotency.Observer, parent context.Context, key string, work func(context.Context) error) error

// deliver runs msg, carrying parent's trace in its metadata, through mw.
func deliver(mw message.HandlerMiddleware, parent context.Context, key string, work func(context.Context) error) error {
	h := mw(func(msg *message.Message) ([]*message.Message, error) { return nil, work(msg.Context()) })
	msg := message.NewMessage(key, []byte(`{}`))
	propagation.TraceContext{}.Inject(parent, propagation.MapCarrier(msg.Metadata))
	_, err := h(msg)
	return err
}

func sqliteRepo(t *testing.T) *sqlite.Repository {
	repo, err := sqlite.NewRepository(testenv.SQLite(t), sqlite.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	return repo
}

var entries = map[string]struct {
	run        entry
	span, mode string
	kind       trace.SpanKind
}{
	"inbox": {span: "inbox billing", mode: "transactional", kind: trace.SpanKindConsumer,
		run: func(t *testing.T, obs idempotency.Observer, parent context.Context, key string, work func(context.Context) error) error {
			repo := sqliteRepo(t)
			inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing", Observer: obs})
			require.NoError(t, err)
			return deliver(inbox.Middleware, parent, key, work)
		}},
	"two-phase inbox": {span: "inbox billing", mode: "two-phase", kind: trace.SpanKindConsumer,
		run: func(t *testing.T, obs idempotency.Observer, parent context.Context, key string, work func(context.Context) error) error {
			inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: memory.NewRepository(), Consumer: "billing", Observer: obs})
			require.NoError(t, err)
			return deliver(inbox.Middleware, parent, key, work)
		}},
	"natural key": {span: "inbox billing", mode: "natural", kind: trace.SpanKindConsumer,
		run: func(_ *testing.T, obs idempotency.Observer, parent context.Context, key string, work func(context.Context) error) error {
			return deliver(middleware.NewNaturalKey(middleware.NaturalKeyConfig{Consumer: "billing", Observer: obs}).Middleware, parent, key, work)
		}},
	"once": {span: "once billing", mode: "once", kind: trace.SpanKindInternal,
		run: func(t *testing.T, obs idempotency.Observer, parent context.Context, key string, work func(context.Context) error) error {
			o, err := once.NewTwoPhase(once.TwoPhaseConfig{Repository: memory.NewRepository(), Scope: "billing", Observer: obs})
			require.NoError(t, err)
			_, err = o.Do(parent, key, func(ctx context.Context) ([]byte, error) { return nil, work(ctx) })
			return err
		}},
	"once transactional": {span: "once billing", mode: "once", kind: trace.SpanKindInternal,
		run: func(t *testing.T, obs idempotency.Observer, parent context.Context, key string, work func(context.Context) error) error {
			repo := sqliteRepo(t)
			o, err := once.NewTransactional(repo, once.Config{Scope: "billing", Observer: obs})
			require.NoError(t, err)
			_, err = o.Do(parent, key, func(ctx context.Context, _ *sql.Tx) ([]byte, error) { return nil, work(ctx) })
			return err
		}},
}

// TestDeliverySpans runs a delivery through every entry point of
// package middleware and once, and checks its span: a child of the
// incoming trace, with the idempotency attributes, and the parent of the
// span the handler starts; a failed delivery's span records the error.
func TestDeliverySpans(t *testing.T) {
	for name, e := range entries {
		t.Run(name, func(t *testing.T) {
			tp := tracetest.NewRecorder()
			parent, producer := tp.Tracer("test").Start(t.Context(), "publish order")
			producer.End()

			var handlerSpan trace.SpanContext
			err := e.run(t, tracing.New(tp), parent, "order-1", func(ctx context.Context) error {
				_, span := tp.Tracer("handler").Start(ctx, "charge card")
				handlerSpan = span.SpanContext()
				span.End()
				return nil
			})
			require.NoError(t, err)
			boom := errors.New("card declined")
			require.ErrorIs(t, e.run(t, tracing.New(tp), parent, "order-2", func(context.Context) error { return boom }), boom)

			spans := named(tp, e.span)
			require.Len(t, spans, 2)
			ok, failed := spans[0], spans[1]
			require.Equal(t, e.kind, ok.SpanKind())
			require.Equal(t, producer.SpanContext().SpanID(), ok.Parent().SpanID(), "a child of the incoming trace")
			require.Equal(t, producer.SpanContext().TraceID(), ok.SpanContext().TraceID())
			charge := named(tp, "charge card")
			require.Len(t, charge, 1)
			require.Equal(t, ok.SpanContext().SpanID(), charge[0].Parent().SpanID(), "the handler's span nests under the delivery's")
			require.Equal(t, handlerSpan, charge[0].SpanContext())

			attrs := ok.AttributeStrings()
			require.Equal(t, "billing", attrs["idempotency.consumer"])
			require.Equal(t, e.mode, attrs["idempotency.mode"])
			require.Equal(t, "processed", attrs["idempotency.outcome"])
			if e.mode != "natural" { // NaturalKey has no key of its own
				require.Equal(t, "order-1", attrs["idempotency.key"])
			}
			if e.kind == trace.SpanKindConsumer {
				require.Equal(t, "order-1", attrs["messaging.message.id"])
			}
			require.Equal(t, codes.Unset, ok.Status().Code)

			require.Equal(t, "failed", failed.AttributeStrings()["idempotency.outcome"])
			require.Equal(t, codes.Error, failed.Status().Code)
			require.Len(t, failed.Events(), 1, "the error is recorded")
		})
	}
}

// TestObserversCombine: the Observers combinator starts the span and
// reports the delivery to the other observers in the span's context.
func TestObserversCombine(t *testing.T) {
	tp := tracetest.NewRecorder()
	seen := &reports{}
	err := entries["inbox"].run(t, idempotency.Observers(nil, tracing.New(tp), seen), t.Context(), "order-1", func(context.Context) error { return nil })
	require.NoError(t, err)
	spans := named(tp, "inbox billing")
	require.Len(t, spans, 1)
	require.Equal(t, []string{"processed"}, seen.outcomes)
	require.Equal(t, spans[0].SpanContext(), seen.spans[0], "the other observers report in the delivery's span")
}

// TestEndsOnlyItsOwnSpans: a report whose context does not carry the
// span the Tracer started for that kind of report ends nothing.
func TestEndsOnlyItsOwnSpans(t *testing.T) {
	tp := tracetest.NewRecorder()
	a, b := tracing.New(tp), tracing.New(tp)
	d := idempotency.Delivery{Scope: "billing", Mode: "transactional", Outcome: idempotency.OutcomeProcessed}

	a.ObserveDelivery(t.Context(), d) // not started
	ctx := b.StartDelivery(t.Context(), d)
	a.ObserveDelivery(ctx, d)                     // another Tracer's
	b.ObserveRelayBatch(ctx, outbox.RelayBatch{}) // another kind
	b.ObserveJanitorBatch(ctx, janitor.Batch{})   // another kind
	require.Empty(t, tp.Ended())
	b.ObserveDelivery(ctx, d)
	require.Len(t, tp.Ended(), 1)
}

// TestNoopProviderStartsNothing: a Tracer on a no-op provider neither
// starts spans nor allocates.
func TestNoopProviderStartsNothing(t *testing.T) {
	tr := tracing.New(noop.NewTracerProvider())
	d := idempotency.Delivery{Scope: "billing", Mode: "transactional", MessageUUID: "order-1"}
	ctx := t.Context()
	allocs := testing.AllocsPerRun(100, func() {
		c := tr.StartDelivery(ctx, d)
		tr.ObserveDelivery(c, d)
		c = tr.StartRelayBatch(ctx, outbox.RelayBatch{Relay: "orders"})
		tr.ObserveRelayBatch(c, outbox.RelayBatch{Relay: "orders"})
	})
	require.Zero(t, allocs)
	require.Equal(t, ctx, tr.StartDelivery(ctx, d))
}

// TestRelayBatchSpans: a relay batch runs in its span, which the
// messages it publishes carry in their context, and ends with the
// batch's counts; a poll that claims nothing makes no span (an idle relay
// would make one a poll), a failed batch records its error, and so does
// one that failed before it claimed anything.
func TestRelayBatchSpans(t *testing.T) {
	db := testenv.SQLite(t)
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.SQLite})
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(t.Context(), db))
	tx, err := db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, ob.WriteTx(t.Context(), tx,
		outbox.Outgoing{Topic: "orders", Message: message.NewMessage("m-1", []byte("1"))},
		outbox.Outgoing{Topic: "orders", Message: message.NewMessage("m-2", []byte("2"))}))
	require.NoError(t, tx.Commit())

	tp := tracetest.NewRecorder()
	pub := &publisher{}
	batches := &relayReports{}
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: sqldialect.SQLite, Name: "orders",
		Observer: outbox.RelayObservers(batches, nil, tracing.New(tp))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = relay.Close() })

	n, err := relay.ForwardBatch(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = relay.ForwardBatch(t.Context()) // nothing left
	require.NoError(t, err)
	require.Zero(t, n)

	spans := named(tp, "outbox relay orders")
	require.Len(t, spans, 1, "the empty poll makes no span")
	full := spans[0]
	require.Equal(t, map[attribute.Key]string{"outbox.relay": "orders", "outbox.claimed": "2", "outbox.published": "2", "outbox.dead_lettered": "0"}, full.AttributeStrings())
	require.Equal(t, []trace.SpanContext{full.SpanContext(), full.SpanContext()}, pub.spans, "the messages are published in the batch's span")
	require.Equal(t, 1, batches.n, "the empty poll is not reported")

	// A failed batch.
	tx, err = db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	require.NoError(t, ob.WriteTx(t.Context(), tx, outbox.Outgoing{Topic: "orders", Message: message.NewMessage("m-3", []byte("3"))}))
	require.NoError(t, tx.Commit())
	pub.fail = errors.New("broker down")
	_, err = relay.ForwardBatch(t.Context())
	require.ErrorIs(t, err, pub.fail)
	spans = named(tp, "outbox relay orders")
	require.Len(t, spans, 2)
	require.Equal(t, codes.Error, spans[1].Status().Code)
	require.Equal(t, "1", spans[1].AttributeStrings()["outbox.claimed"])

	// A batch that cannot begin: the database is gone.
	require.NoError(t, db.Close())
	_, err = relay.ForwardBatch(t.Context())
	require.Error(t, err)
	spans = named(tp, "outbox relay orders")
	require.Len(t, spans, 3, "a batch that failed before claiming gets a span of its own")
	require.Equal(t, codes.Error, spans[2].Status().Code)
	require.Equal(t, "0", spans[2].AttributeStrings()["outbox.claimed"])
}

// TestJanitorBatchSpans: each janitor batch gets a span with the count
// it deleted.
func TestJanitorBatchSpans(t *testing.T) {
	repo := memory.NewRepository()
	past := time.Now().Add(-time.Hour)
	for _, key := range []string{"k-1", "k-2"} {
		_, err := repo.Acquire(t.Context(), repository.AcquireParams{Consumer: "billing", Key: key, Owner: "o",
			Now: past.Add(-time.Minute), LeaseUntil: past.Add(-time.Second), ExpiresAt: past})
		require.NoError(t, err)
	}
	tp := tracetest.NewRecorder()
	j, err := janitor.NewJanitor(repo, janitor.Config{Observer: janitor.Observers(tracing.New(tp), nil)})
	require.NoError(t, err)
	n, err := j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, n)
	spans := named(tp, "janitor delete expired")
	require.Len(t, spans, 1)
	require.Equal(t, "2", spans[0].AttributeStrings()["janitor.deleted"])
	require.Equal(t, trace.SpanKindInternal, spans[0].SpanKind())
}

// named returns the ended spans called name, in the order they ended.
func named(tp *tracetest.Recorder, name string) []*tracetest.Span {
	var out []*tracetest.Span
	for _, s := range tp.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// reports is a idempotency.Observer that keeps each delivery's outcome
// and the span context it was reported in.
type reports struct {
	mu       sync.Mutex
	outcomes []string
	spans    []trace.SpanContext
}

func (r *reports) ObserveDelivery(ctx context.Context, d idempotency.Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outcomes = append(r.outcomes, string(d.Outcome))
	r.spans = append(r.spans, trace.SpanContextFromContext(ctx))
}

// relayReports counts relay batches.
type relayReports struct{ n int }

func (r *relayReports) ObserveRelayBatch(context.Context, outbox.RelayBatch) { r.n++ }

// publisher keeps the span context of every message it publishes, or
// fails with fail.
type publisher struct {
	spans []trace.SpanContext
	fail  error
}

func (p *publisher) Publish(_ string, msgs ...*message.Message) error {
	if p.fail != nil {
		return p.fail
	}
	for _, m := range msgs {
		p.spans = append(p.spans, trace.SpanContextFromContext(m.Context()))
	}
	return nil
}

func (p *publisher) Close() error { return nil }
