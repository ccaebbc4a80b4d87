package middleware

import (
	"context"
	"maps"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemkit/watermill-idempotent/internal/fanout"
)

// Outcome is what an inbox did with one delivery.
type Outcome string

// The outcomes of a delivery, as reported to an Observer and logged.
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
	Consumer string
	// Mode is the entry point: "transactional" (Inbox), "two-phase"
	// (TwoPhaseInbox), "natural" (NaturalKey), "once" (package once) or
	// "http" (package httpidem).
	Mode          string
	Key           string // empty for OutcomeNoKey and OutcomeNoScope
	MessageUUID   string
	CorrelationID string
	// HTTPRoute and HTTPStatus are the request's route (httpidem's
	// Config.Route) and its response's status; package httpidem sets
	// them, the others leave them empty. HTTPStatus is 0 at
	// StartDelivery.
	HTTPRoute  string
	HTTPStatus int
	Outcome    Outcome
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

// DeliveryStarter is the optional part of an Observer, found by type
// assertion: when the Observer implements it, StartDelivery is called as
// a delivery enters, before its key is claimed, with what is known then
// (Consumer, Mode, MessageUUID, CorrelationID; Key in package once,
// HTTPRoute in package httpidem). ctx carries the message's trace
// context, extracted from its traceparent. The context it returns is the
// one the delivery runs in — its claim, the handler (msg.Context()) and
// its outputs' trace context — and the one ObserveDelivery receives at
// the end, so an Observer can start a span here and end it there (see
// package tracing). It is called exactly once before each
// ObserveDelivery, except for a call refused before it began (a nil
// function in package once). It must be fast and safe for concurrent
// use.
type DeliveryStarter interface {
	StartDelivery(ctx context.Context, d Delivery) context.Context
}

// Observer receives the outcome of every delivery: the extension point
// for metrics (metrics.Metrics implements it) and tracing (tracing.Tracer
// does). It is called synchronously after the delivery's transaction
// ended, with the context StartDelivery returned (or the delivery's own
// when the Observer is no DeliveryStarter), so it must be fast and safe
// for concurrent use. An Observer that also implements DeliveryStarter
// is told when each delivery begins too.
//
// Every entry point takes one: Config, TwoPhaseConfig and
// NaturalKeyConfig here, and the configs of packages once and httpidem.
// Without one, nothing is reported and no span is started; the trace
// context of a message (its W3C traceparent) is still carried on to the
// handler and to its output messages.
type Observer interface {
	ObserveDelivery(ctx context.Context, d Delivery)
}

// Observers returns an Observer reporting to every one of obs, in turn;
// each that implements DeliveryStarter starts the delivery in the
// context the one before returned. Nil entries are skipped. Use it to
// give one inbox metrics and tracing:
// Observers(m, tracing.New(tp)).
func Observers(obs ...Observer) Observer { return observers(obs) }

type observers []Observer

func (o observers) ObserveDelivery(ctx context.Context, d Delivery) {
	fanout.Report(ctx, o, d, Observer.ObserveDelivery)
}

func (o observers) StartDelivery(ctx context.Context, d Delivery) context.Context {
	return fanout.Start(ctx, o, d, DeliveryStarter.StartDelivery)
}

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
	d        Delivery
	start    time.Time
	logger   watermill.LoggerAdapter
	observer Observer
	// fields are the delivery's log fields, nil when the logger is
	// watermill.NopLogger: nothing is logged, so nothing is built.
	fields watermill.LogFields
}

// observability is the shared part of both inboxes' configuration.
type observability struct {
	mode   string
	logger watermill.LoggerAdapter
	quiet  bool // logger is watermill.NopLogger
	// observer and starter may be nil; starter is observer as a
	// DeliveryStarter.
	observer   Observer
	starter    DeliveryStarter
	propagator propagation.TextMapPropagator
}

func newObservability(mode string, logger watermill.LoggerAdapter, observer Observer) observability {
	_, quiet := logger.(watermill.NopLogger)
	starter, _ := observer.(DeliveryStarter)
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
// DeliveryStarter, if any, and returns the context the inbox works in.
// scope names the delivery's consumer.
func (o observability) begin(msg *message.Message, scope string) (*observation, context.Context) {
	ctx := msg.Context()
	correlationID := wmiddleware.MessageCorrelationID(msg)
	obs := &observation{
		d:        Delivery{Consumer: scope, Mode: o.mode, MessageUUID: msg.UUID, CorrelationID: correlationID},
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
		ctx = fanout.Started(ctx, o.starter, obs.d, DeliveryStarter.StartDelivery, o.logger, obs.fields)
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
func (obs *observation) end(ctx context.Context, outcome Outcome, err error, extra watermill.LogFields) error {
	obs.d.Outcome = outcome
	obs.d.Err = err
	obs.d.Total = time.Since(obs.start)
	if obs.fields != nil {
		obs.log(outcome, err, extra)
	}
	if obs.observer != nil {
		fanout.Reported(ctx, obs.observer, obs.d, Observer.ObserveDelivery, obs.logger, obs.fields)
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
	case obs.d.Mode == modeNatural && outcome == OutcomeDuplicate:
		obs.logger.Info("NaturalKey: business row exists, duplicate acknowledged", fields)
		return
	case obs.d.Mode == modeNatural && outcome == OutcomeFailed:
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
