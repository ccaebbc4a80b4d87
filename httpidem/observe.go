package httpidem

import (
	"context"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/fanout"
)

// observation follows one request the way the inbox follows a delivery:
// one idempotency.Delivery (ModeHTTP) for the Observer, so
// metrics.Metrics counts HTTP requests in deliveries_total under the
// consumer Namespace and tracing.Tracer gives each a span.
type observation struct {
	d       idempotency.Delivery
	start   time.Time
	claimed time.Duration // until the handler started; 0: it did not
	status  int           // the response's status, for the log fields
	// parent is the span the request came in with; a DeliveryStarter
	// that started another one gets the response's status on it.
	parent   trace.Span
	observer idempotency.Observer
	logger   watermill.LoggerAdapter
}

// begin starts observing a request: its context continues the span in
// the request's context or else the W3C traceparent the request
// carries, and the Observer's DeliveryStarter, if any, starts it.
func (m *Idempotency) begin(r *http.Request, route string) (*observation, context.Context) {
	ctx := r.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(r.Header))
	}
	o := &observation{
		d:        idempotency.Delivery{Scope: m.config.Namespace, Mode: idempotency.ModeHTTP, Operation: route},
		observer: m.config.Observer,
		logger:   m.config.Logger,
	}
	if s, ok := o.observer.(idempotency.DeliveryStarter); ok {
		o.parent = trace.SpanFromContext(ctx)
		ctx = fanout.Started(ctx, s, o.d, idempotency.DeliveryStarter.StartDelivery, o.logger, o.fields())
	}
	o.start = time.Now()
	return o, ctx
}

func (o *observation) setKey(key string) { o.d.Key = key }

// handlerStarted marks the end of the claim.
func (o *observation) handlerStarted() { o.claimed = time.Since(o.start) }

// end reports the delivery with its outcome and response status. err is
// what made the outcome a failure, if any.
func (o *observation) end(ctx context.Context, outcome idempotency.Outcome, status int, err error) {
	o.d.Outcome, o.d.Err, o.d.Total, o.status = outcome, err, time.Since(o.start), status
	o.d.Claim = o.claimed
	if o.claimed == 0 {
		o.d.Claim = o.d.Total
	}
	if span := trace.SpanFromContext(ctx); o.parent != nil && span != o.parent && span.IsRecording() && status != 0 {
		// Delivery carries no HTTP fields: the span an Observer started
		// for the request (tracing.Tracer's) gets its status here.
		span.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if o.observer != nil {
		fanout.Reported(ctx, o.observer, o.d, idempotency.Observer.ObserveDelivery, o.logger, o.fields())
	}
}

func (o *observation) fields() watermill.LogFields {
	return watermill.LogFields{"namespace": o.d.Scope, "route": o.d.Operation, "key": o.d.Key, "outcome": string(o.d.Outcome), "status": o.status}
}
