package httpidem

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/watermill-idempotent/middleware"
)

// instrumentationName names this package's tracer.
const instrumentationName = "github.com/idemkit/watermill-idempotent/httpidem"

// observation follows one request the way the inbox follows a delivery:
// one span with the same idempotency.* attributes (mode "http"), and one
// middleware.Delivery for the Observer, so metrics.Metrics counts HTTP
// requests in deliveries_total under the consumer Namespace.
type observation struct {
	d        middleware.Delivery
	start    time.Time
	claimed  time.Duration // until the handler started; 0: it did not
	span     trace.Span
	observer middleware.Observer
}

// begin starts the request's span, a child of the span in the request's
// context or else of the W3C traceparent the request carries.
func (m *Idempotency) begin(r *http.Request, route string) (*observation, context.Context) {
	ctx := r.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(r.Header))
	}
	ctx, span := m.tracer.Start(ctx, "idempotency "+route,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			attribute.String("idempotency.consumer", m.config.Namespace),
			attribute.String("idempotency.mode", "http"),
			attribute.String("http.route", route),
		))
	return &observation{
		d:        middleware.Delivery{Consumer: m.config.Namespace},
		start:    time.Now(),
		span:     span,
		observer: m.config.Observer,
	}, ctx
}

func (o *observation) setKey(key string) {
	o.d.Key = key
	o.span.SetAttributes(attribute.String("idempotency.key", key))
}

// handlerStarted marks the end of the claim.
func (o *observation) handlerStarted() { o.claimed = time.Since(o.start) }

// end records the outcome and the response status on the span and
// reports the delivery. err is what made the outcome a failure, if any.
func (o *observation) end(ctx context.Context, outcome middleware.Outcome, status int, err error) {
	o.d.Outcome, o.d.Err, o.d.Total = outcome, err, time.Since(o.start)
	o.d.Claim = o.claimed
	if o.claimed == 0 {
		o.d.Claim = o.d.Total
	}
	o.span.SetAttributes(
		attribute.String("idempotency.outcome", string(outcome)),
		attribute.Int("http.response.status_code", status),
	)
	if err != nil {
		o.span.RecordError(err)
		o.span.SetStatus(codes.Error, string(outcome))
	}
	o.span.End()
	if o.observer != nil {
		o.observer.ObserveDelivery(ctx, o.d)
	}
}

func tracerFrom(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(instrumentationName)
}
