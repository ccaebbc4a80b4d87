package middleware

import (
	"context"
	"maps"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/fanout"
)

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

// observation follows one delivery: its timings, logs and observer
// call.
type observation struct {
	d        idempotency.Delivery
	start    time.Time
	logger   watermill.LoggerAdapter
	observer idempotency.Observer
	// fields are the delivery's log fields, nil when the logger is
	// watermill.NopLogger: nothing is logged, so nothing is built.
	fields watermill.LogFields
}

// observability is the shared part of both inboxes' configuration.
type observability struct {
	mode   idempotency.Mode
	logger watermill.LoggerAdapter
	quiet  bool // logger is watermill.NopLogger
	// observer and starter may be nil; starter is observer as a
	// idempotency.DeliveryStarter.
	observer   idempotency.Observer
	starter    idempotency.DeliveryStarter
	propagator propagation.TextMapPropagator
}

func newObservability(mode idempotency.Mode, logger watermill.LoggerAdapter, observer idempotency.Observer) observability {
	_, quiet := logger.(watermill.NopLogger)
	starter, _ := observer.(idempotency.DeliveryStarter)
	return observability{
		mode:       mode,
		logger:     logger,
		quiet:      quiet,
		observer:   observer,
		starter:    starter,
		propagator: propagation.TraceContext{},
	}
}

// begin continues the trace context the message carries in its metadata
// (W3C traceparent), if any, starts the delivery with the observer's
// idempotency.DeliveryStarter, if any, and returns the context the inbox works in.
// scope names the delivery's consumer.
func (o observability) begin(msg *message.Message, scope string) (*observation, context.Context) {
	ctx := msg.Context()
	correlationID := wmiddleware.MessageCorrelationID(msg)
	obs := &observation{
		d: idempotency.Delivery{Scope: scope, Mode: o.mode, Operation: message.HandlerNameFromCtx(ctx),
			MessageUUID: msg.UUID, CorrelationID: correlationID},
		logger:   o.logger,
		observer: o.observer,
	}
	if msg.Metadata.Get(traceparentKey) != "" {
		// The message's trace continues in the handler's and the
		// outputs' context (and in the span of an Observer that starts
		// one). TraceContext's Extract returns ctx as it is for an
		// invalid traceparent; asking for it first spares the call when
		// there is none.
		ctx = o.propagator.Extract(ctx, metadataCarrier(msg.Metadata))
	}
	if !o.quiet {
		obs.fields = watermill.LogFields{"consumer": scope, "message_uuid": msg.UUID, "correlation_id": correlationID}
	}
	if o.starter != nil {
		ctx = fanout.Started(ctx, o.starter, obs.d, idempotency.DeliveryStarter.StartDelivery, o.logger, obs.fields)
	}
	obs.start = time.Now()
	return obs, ctx
}

// traceparentKey is the metadata field of the W3C trace context.
const traceparentKey = "traceparent"

func (obs *observation) setKey(key string) {
	obs.d.Key = key
	obs.setField("key", key)
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

// end records the outcome: one log line at a level fitting the
// outcome, and the observer call. It returns err.
func (obs *observation) end(ctx context.Context, outcome idempotency.Outcome, err error, extra watermill.LogFields) error {
	obs.d.Outcome = outcome
	obs.d.Err = err
	obs.d.Total = time.Since(obs.start)
	if obs.fields != nil {
		obs.log(outcome, err, extra)
	}
	if obs.observer != nil {
		fanout.Reported(ctx, obs.observer, obs.d, idempotency.Observer.ObserveDelivery, obs.logger, obs.fields)
	}
	return err
}

// log writes the delivery's one log line, at a level fitting its outcome.
func (obs *observation) log(outcome idempotency.Outcome, err error, extra watermill.LogFields) {
	fields := make(watermill.LogFields, len(obs.fields)+1+len(extra))
	maps.Copy(fields, obs.fields)
	fields["outcome"] = string(outcome)
	maps.Copy(fields, extra)
	switch {
	case obs.d.Mode == modeNatural && outcome == idempotency.OutcomeDuplicate:
		obs.logger.Info("NaturalKey: business row exists, duplicate acknowledged", fields)
		return
	case obs.d.Mode == modeNatural && outcome == idempotency.OutcomeFailed:
		return // the router logs the handler's error
	}
	switch outcome {
	case idempotency.OutcomeProcessed:
		obs.logger.Debug("Inbox: processed", fields)
	case idempotency.OutcomeDuplicate, idempotency.OutcomeReplayed:
		obs.logger.Info("Inbox: duplicate acknowledged without running the handler", fields)
	case idempotency.OutcomeStaleVersion:
		obs.logger.Info("Inbox: stale version acknowledged and skipped", fields)
	case idempotency.OutcomeLeaseBusy:
		fields["err"] = err
		obs.logger.Info("Inbox: key in progress elsewhere, retry later", fields)
	case idempotency.OutcomeFailed:
		// The router logs the handler's error too; this line adds the key.
		fields["err"] = err
		obs.logger.Info("Inbox: delivery failed, nothing committed, will be retried", fields)
	default: // no key, no scope, payload mismatch, needs intervention: permanent
		obs.logger.Error("Inbox: delivery refused", err, fields)
	}
}
