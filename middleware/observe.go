package middleware

import (
	"context"
	"maps"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Outcome is what an inbox did with one delivery.
type Outcome string

// The outcomes of a delivery, as reported to an Observer, logged and set
// on the delivery's span.
const (
	// OutcomeProcessed: the handler ran and its effects committed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: already processed; acknowledged without running the
	// handler, with no stored output to replay.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeReplayed: already processed; acknowledged without running the
	// handler, and its stored output messages were returned again.
	OutcomeReplayed Outcome = "replayed"
	// OutcomePayloadMismatch: the key was processed with another payload
	// (ErrPayloadMismatch).
	OutcomePayloadMismatch Outcome = "payload_mismatch"
	// OutcomeNoKey: the message had no deduplication key (ErrNoKey).
	OutcomeNoKey Outcome = "no_key"
	// OutcomeNoScope: the delivery had no scope or an invalid one
	// (ErrNoScope, ErrInvalidScope); Delivery.Consumer is then the
	// configured Consumer (package httpidem: its Namespace).
	OutcomeNoScope Outcome = "no_scope"
	// OutcomeStaleVersion: the handler reported a stale version
	// (ErrStaleVersion); acknowledged and skipped.
	OutcomeStaleVersion Outcome = "stale_version"
	// OutcomeLeaseBusy: another delivery holds the key (ErrInProgress);
	// retried later.
	OutcomeLeaseBusy Outcome = "lease_busy"
	// OutcomeNeedsIntervention: an earlier attempt expired mid-effect
	// (ErrNeedsIntervention).
	OutcomeNeedsIntervention Outcome = "needs_intervention"
	// OutcomeFailed: the handler, the store or the commit failed; nothing
	// was committed and the delivery will be retried.
	OutcomeFailed Outcome = "failed"
)

// Delivery describes one delivery as seen by an inbox.
type Delivery struct {
	// Consumer is the delivery's scope, the consumer its record is stored
	// under (see Config.Consumer).
	Consumer      string
	Key           string // empty for OutcomeNoKey and OutcomeNoScope
	MessageUUID   string
	CorrelationID string
	Outcome       Outcome
	// Err is the error returned to the router; nil when acknowledged.
	Err error
	// Replayed is how many stored output messages were returned again.
	Replayed int
	// Claim is how long claiming the key took (the conditional insert and,
	// on a duplicate, reading the stored record; with BEGIN where the two
	// share a round trip, as on a ClaimBeginner or a BatchClaimBeginner;
	// plus the read before the transaction when the inbox reads first).
	Claim time.Duration
	// Total is the delivery's whole time in the inbox: claim, handler and
	// commit (or completion, in two-phase mode).
	Total time.Duration
	// Batch is how many deliveries committed in this delivery's
	// transaction under group commit (Config.Batch), itself included; 0
	// outside group commit and for deliveries that did not commit.
	Batch int
}

// Observer receives the outcome of every delivery, for metrics. It is
// called synchronously after the delivery's transaction ended, so it must
// be fast and safe for concurrent use. The metrics package provides a
// Prometheus implementation.
type Observer interface {
	ObserveDelivery(ctx context.Context, d Delivery)
}

// instrumentationName names this library's tracer.
const instrumentationName = "github.com/idemkit/watermill-idempotent/middleware"

// metadataCarrier adapts message metadata to OpenTelemetry propagation.
type metadataCarrier message.Metadata

func (c metadataCarrier) Get(key string) string { return c[key] }
func (c metadataCarrier) Set(key, value string) { c[key] = value }
func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// observation follows one delivery: its span, timings, logs and observer
// call.
type observation struct {
	d     Delivery
	start time.Time
	// span is nil when the inbox has no tracer (a no-op TracerProvider);
	// recording is span.IsRecording(): attributes and errors are only
	// worth building for a span that keeps them.
	span      trace.Span
	recording bool
	logger    watermill.LoggerAdapter
	observer  Observer
	mode      string
	// fields are the delivery's log fields, nil when the logger is
	// watermill.NopLogger: nothing is logged, so nothing is built.
	fields watermill.LogFields
}

// observability is the shared part of both inboxes' configuration.
type observability struct {
	mode   string
	logger watermill.LoggerAdapter
	quiet  bool // logger is watermill.NopLogger
	// observer and tracer may be nil: no observer, a no-op
	// TracerProvider.
	observer   Observer
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
}

func newObservability(mode string, logger watermill.LoggerAdapter, observer Observer, tp trace.TracerProvider) observability {
	if tp == nil {
		// Not known to be a no-op: a provider installed later (or
		// automatic instrumentation) takes over the global one's tracers.
		tp = otel.GetTracerProvider()
	}
	var tracer trace.Tracer
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider: // no spans: skip them
	default:
		tracer = tp.Tracer(instrumentationName)
	}
	_, quiet := logger.(watermill.NopLogger)
	return observability{
		mode:       mode,
		logger:     logger,
		quiet:      quiet,
		observer:   observer,
		tracer:     tracer,
		propagator: propagation.TraceContext{},
	}
}

// begin starts the delivery's span as a child of the trace context the
// message carries in its metadata (W3C traceparent), if any, and returns
// the context the inbox works in. scope names the delivery's consumer.
func (o observability) begin(msg *message.Message, scope string) (*observation, context.Context) {
	ctx := msg.Context()
	correlationID := wmiddleware.MessageCorrelationID(msg)
	obs := &observation{
		d:        Delivery{Consumer: scope, MessageUUID: msg.UUID, CorrelationID: correlationID},
		logger:   o.logger,
		observer: o.observer,
		mode:     o.mode,
	}
	if msg.Metadata.Get(traceparentKey) != "" {
		// The message's trace continues in our span, or without one (no
		// tracer) in the handler's and the outputs' context.
		// TraceContext's Extract returns ctx as it is for an invalid
		// traceparent; asking for it first spares the call when there is
		// none.
		ctx = o.propagator.Extract(ctx, metadataCarrier(msg.Metadata))
	}
	if o.tracer != nil {
		name := "inbox"
		if scope != "" {
			name += " " + scope
		}
		ctx, obs.span = o.tracer.Start(ctx, name,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.String("idempotency.consumer", scope),
				attribute.String("idempotency.mode", o.mode),
				attribute.String("messaging.message.id", msg.UUID),
			))
		obs.recording = obs.span.IsRecording()
	}
	if !o.quiet {
		obs.fields = watermill.LogFields{"consumer": scope, "message_uuid": msg.UUID, "correlation_id": correlationID}
	}
	obs.start = time.Now()
	return obs, ctx
}

// traceparentKey is the metadata field of the W3C trace context.
const traceparentKey = "traceparent"

func (obs *observation) setKey(key string) {
	obs.d.Key = key
	obs.setField("key", key)
	if obs.recording {
		obs.span.SetAttributes(attribute.String("idempotency.key", key))
	}
}

// setField adds a field to the delivery's log lines, if anything logs
// them.
func (obs *observation) setField(name string, value any) {
	if obs.fields != nil {
		obs.fields[name] = value
	}
}

// inject writes the delivery's trace context into outgoing messages that
// do not carry one yet, so downstream consumers (and the outbox) continue
// the trace.
func (o observability) inject(ctx context.Context, msgs []*message.Message) {
	for _, m := range msgs {
		if m.Metadata == nil {
			m.Metadata = message.Metadata{}
		}
		if m.Metadata.Get("traceparent") == "" {
			o.propagator.Inject(ctx, metadataCarrier(m.Metadata))
		}
	}
}

// end records the outcome: span status and attributes, one log line at a
// level fitting the outcome, and the observer call. It returns err.
func (obs *observation) end(ctx context.Context, outcome Outcome, err error, extra watermill.LogFields) error {
	obs.d.Outcome = outcome
	obs.d.Err = err
	obs.d.Total = time.Since(obs.start)

	if obs.recording {
		obs.span.SetAttributes(attribute.String("idempotency.outcome", string(outcome)))
		if obs.d.Replayed > 0 {
			obs.span.SetAttributes(attribute.Int("idempotency.replayed", obs.d.Replayed))
		}
		if err != nil {
			obs.span.RecordError(err)
			obs.span.SetStatus(codes.Error, string(outcome))
		}
	}
	if obs.span != nil {
		obs.span.End()
	}
	if obs.fields != nil {
		obs.log(outcome, err, extra)
	}
	if obs.observer != nil {
		obs.observer.ObserveDelivery(ctx, obs.d)
	}
	return err
}

// log writes the delivery's one log line, at a level fitting its outcome.
func (obs *observation) log(outcome Outcome, err error, extra watermill.LogFields) {
	fields := make(watermill.LogFields, len(obs.fields)+1+len(extra))
	maps.Copy(fields, obs.fields)
	fields["outcome"] = string(outcome)
	maps.Copy(fields, extra)
	switch {
	case obs.mode == modeNatural && outcome == OutcomeDuplicate:
		obs.logger.Info("NaturalKey: business row exists, duplicate acknowledged", fields)
		return
	case obs.mode == modeNatural && outcome == OutcomeFailed:
		return // the router logs the handler's error
	}
	switch outcome {
	case OutcomeProcessed:
		obs.logger.Debug("Inbox: processed", fields)
	case OutcomeDuplicate, OutcomeReplayed:
		obs.logger.Info("Inbox: duplicate acknowledged without running the handler", fields)
	case OutcomeStaleVersion:
		obs.logger.Info("Inbox: stale version acknowledged and skipped", fields)
	case OutcomeLeaseBusy:
		fields["err"] = err
		obs.logger.Info("Inbox: key in progress elsewhere, retry later", fields)
	case OutcomeFailed:
		// The router logs the handler's error too; this line adds the key.
		fields["err"] = err
		obs.logger.Info("Inbox: delivery failed, nothing committed, will be retried", fields)
	default: // no key, no scope, payload mismatch, needs intervention: permanent
		obs.logger.Error("Inbox: delivery refused", err, fields)
	}
}
