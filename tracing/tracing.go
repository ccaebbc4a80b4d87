package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
)

// instrumentationName names the tracer.
const instrumentationName = "github.com/idemkit/watermill-idempotent/tracing"

// Tracer starts and ends the spans of deliveries, relay batches and
// janitor batches. It is a idempotency.Observer and DeliveryStarter, an
// outbox.RelayObserver and RelayBatchStarter, and a janitor.Observer and
// BatchStarter. It ends only the spans it started: a report whose
// context did not come from its start part is ignored. A Tracer is safe
// for concurrent use.
type Tracer struct {
	tracer trace.Tracer // nil: a no-op provider, no spans
}

// New returns a Tracer whose spans tp starts. A nil tp is the global
// otel.GetTracerProvider() at the time of the call (it delegates to a
// provider installed later); a noop provider gives a Tracer that starts
// nothing.
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return &Tracer{}
	}
	return &Tracer{tracer: tp.Tracer(instrumentationName)}
}

var _ interface {
	idempotency.DeliveryStarter
	idempotency.Observer
	outbox.RelayBatchStarter
	outbox.RelayObserver
	janitor.BatchStarter
	janitor.Observer
} = (*Tracer)(nil)

// The context keys under which a Tracer keeps the span it started, one
// type per kind of span, so a report finds its own kind only.
type (
	deliveryKey struct{ *Tracer }
	relayKey    struct{ *Tracer }
	janitorKey  struct{ *Tracer }
)

// StartDelivery starts the delivery's span, a child of ctx's, and
// returns ctx with it. It implements idempotency.DeliveryStarter.
func (t *Tracer) StartDelivery(ctx context.Context, d idempotency.Delivery) context.Context {
	if t.tracer == nil {
		return ctx
	}
	name, kind := "inbox", trace.SpanKindConsumer
	switch d.Mode {
	case idempotency.ModeHTTP:
		name, kind = "idempotency", trace.SpanKindInternal
	case idempotency.ModeOnce:
		name, kind = "once", trace.SpanKindInternal
	}
	attrs := []attribute.KeyValue{
		attribute.String("idempotency.consumer", d.Scope),
		attribute.String("idempotency.mode", string(d.Mode)),
	}
	switch {
	case d.Mode == idempotency.ModeHTTP && d.Operation != "":
		name += " " + d.Operation
		attrs = append(attrs, attribute.String("http.route", d.Operation))
	case d.Scope != "":
		name += " " + d.Scope
	}
	if d.MessageUUID != "" {
		attrs = append(attrs, attribute.String("messaging.message.id", d.MessageUUID))
	}
	return t.start(ctx, deliveryKey{t}, name, kind, attrs)
}

// ObserveDelivery ends the span StartDelivery put in ctx, with d's
// outcome. It implements idempotency.Observer.
func (t *Tracer) ObserveDelivery(ctx context.Context, d idempotency.Delivery) {
	span := t.started(ctx, deliveryKey{t})
	if span == nil {
		return
	}
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 4)
		if d.Key != "" {
			attrs = append(attrs, attribute.String("idempotency.key", d.Key))
		}
		attrs = append(attrs, attribute.String("idempotency.outcome", string(d.Outcome)))
		if d.Replayed > 0 {
			attrs = append(attrs, attribute.Int("idempotency.replayed", d.Replayed))
		}
		finish(span, attrs, d.Err, string(d.Outcome))
	}
	span.End()
}

// StartRelayBatch starts the batch's span, a child of ctx's, and returns
// ctx with it. It implements outbox.RelayBatchStarter.
func (t *Tracer) StartRelayBatch(ctx context.Context, b outbox.RelayBatch) context.Context {
	if t.tracer == nil {
		return ctx
	}
	return t.start(ctx, relayKey{t}, relaySpanName(b), trace.SpanKindInternal, []attribute.KeyValue{attribute.String("outbox.relay", b.Relay)})
}

func relaySpanName(b outbox.RelayBatch) string {
	if b.Relay == "" {
		return "outbox relay"
	}
	return "outbox relay " + b.Relay
}

// ObserveRelayBatch ends the span StartRelayBatch put in ctx, with b's
// counts. A failed batch reported without a start (it failed before it
// claimed a row, e.g. the database is unreachable) gets a span of its
// own, b.Duration long, so the failure shows in the trace. It implements
// outbox.RelayObserver.
func (t *Tracer) ObserveRelayBatch(ctx context.Context, b outbox.RelayBatch) {
	span := t.started(ctx, relayKey{t})
	if span == nil && b.Err != nil && t.tracer != nil {
		_, span = t.tracer.Start(ctx, relaySpanName(b), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithTimestamp(time.Now().Add(-b.Duration)), trace.WithAttributes(attribute.String("outbox.relay", b.Relay)))
	}
	if span == nil {
		return
	}
	if span.IsRecording() {
		finish(span, []attribute.KeyValue{
			attribute.Int("outbox.claimed", b.Claimed),
			attribute.Int("outbox.published", b.Published),
			attribute.Int("outbox.dead_lettered", b.DeadLettered),
		}, b.Err, "relay batch failed")
	}
	span.End()
}

// StartJanitorBatch starts the batch's span, a child of ctx's, and
// returns ctx with it. It implements janitor.BatchStarter.
func (t *Tracer) StartJanitorBatch(ctx context.Context, _ janitor.Batch) context.Context {
	if t.tracer == nil {
		return ctx
	}
	return t.start(ctx, janitorKey{t}, "janitor delete expired", trace.SpanKindInternal, nil)
}

// ObserveJanitorBatch ends the span StartJanitorBatch put in ctx, with
// b's count. It implements janitor.Observer.
func (t *Tracer) ObserveJanitorBatch(ctx context.Context, b janitor.Batch) {
	span := t.started(ctx, janitorKey{t})
	if span == nil {
		return
	}
	if span.IsRecording() {
		finish(span, []attribute.KeyValue{attribute.Int("janitor.deleted", b.Deleted)}, b.Err, "janitor batch failed")
	}
	span.End()
}

// start starts a span and keeps it in the context under key.
func (t *Tracer) start(ctx context.Context, key any, name string, kind trace.SpanKind, attrs []attribute.KeyValue) context.Context {
	ctx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, key, span)
}

// started returns the span start kept in ctx under key, or nil.
func (t *Tracer) started(ctx context.Context, key any) trace.Span {
	if t.tracer == nil {
		return nil
	}
	span, _ := ctx.Value(key).(trace.Span)
	return span
}

// finish sets a recording span's last attributes and, for an error,
// records it and sets the status to Error with description.
func finish(span trace.Span, attrs []attribute.KeyValue, err error, description string) {
	span.SetAttributes(attrs...)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, description)
	}
}
