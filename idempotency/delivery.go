package idempotency

import (
	"context"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/fanout"
)

// Outcome is what an entry point did with one delivery or call.
type Outcome string

// The outcomes of a delivery, as reported to an Observer and logged.
const (
	// OutcomeProcessed: the handler ran and its effects committed.
	OutcomeProcessed Outcome = "processed"
	// OutcomeDuplicate: already processed; acknowledged without running the
	// handler, with no stored output to replay.
	OutcomeDuplicate Outcome = "duplicate"
	// OutcomeReplayed: already processed; acknowledged without running the
	// handler, and its stored output (messages, a result, a response) was
	// returned again.
	OutcomeReplayed Outcome = "replayed"
	// OutcomePayloadMismatch: the key was processed with another payload
	// (ErrPayloadMismatch).
	OutcomePayloadMismatch Outcome = "payload_mismatch"
	// OutcomeNoKey: the delivery had no deduplication key (ErrNoKey).
	OutcomeNoKey Outcome = "no_key"
	// OutcomeNoScope: the delivery had no scope or an invalid one
	// (ErrNoScope, ErrInvalidScope); Delivery.Scope is then the
	// configured one (the inbox's Consumer, httpidem's Namespace).
	OutcomeNoScope Outcome = "no_scope"
	// OutcomeStaleVersion: the handler reported a stale version
	// (middleware.ErrStaleVersion); acknowledged and skipped.
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

// Mode is the entry point a delivery went through.
type Mode string

// The entry points.
const (
	// ModeTransactional is middleware.Inbox: the key's record and the
	// handler's writes commit in one database transaction.
	ModeTransactional Mode = "transactional"
	// ModeTwoPhase is middleware.TwoPhaseInbox: a leased claim, the
	// effect, then the key completed.
	ModeTwoPhase Mode = "two-phase"
	// ModeNatural is middleware.NaturalKey: the business table's own
	// unique constraint deduplicates.
	ModeNatural Mode = "natural"
	// ModeOnce is package once.
	ModeOnce Mode = "once"
	// ModeHTTP is package httpidem.
	ModeHTTP Mode = "http"
)

// Delivery describes one delivery or call as seen by an entry point.
type Delivery struct {
	// Scope is the scope the key's record is stored under: the inbox's
	// Consumer and handler name, once's Scope, httpidem's Namespace and
	// principal.
	Scope string
	// Mode is the entry point.
	Mode Mode
	// Operation names what was called: the Watermill handler's name for
	// the inbox (empty outside a router), the route for package httpidem
	// (its Config.Route), empty for package once.
	Operation     string
	Key           string // empty for OutcomeNoKey and OutcomeNoScope
	MessageUUID   string // the inbox only
	CorrelationID string // the inbox only
	Outcome       Outcome
	// Err is the error returned to the caller (the router, Do's caller,
	// the HTTP client as a status); nil when acknowledged.
	Err error
	// Replayed is how many stored output messages were returned again.
	Replayed int
	// Claim is how long claiming the key took (the conditional insert and,
	// on a duplicate, reading the stored record; with BEGIN where the two
	// share a round trip; plus the read before the transaction when the
	// inbox reads first).
	Claim time.Duration
	// Total is the delivery's whole time in the entry point: claim,
	// handler and commit (or completion, in two-phase mode).
	Total time.Duration
	// Batch is how many deliveries committed in this delivery's
	// transaction under group commit (middleware.BatchConfig), itself
	// included; 0 outside group commit and for deliveries that did not
	// commit.
	Batch int
}

// DeliveryStarter is the optional part of an Observer, found by type
// assertion: when the Observer implements it, StartDelivery is called as
// a delivery enters, before its key is claimed, with what is known then
// (Scope, Mode, Operation; MessageUUID and CorrelationID in the inbox;
// Key in package once). ctx carries the message's trace context,
// extracted from its traceparent. The context it returns is the one the
// delivery runs in — its claim, the handler and its outputs' trace
// context — and the one ObserveDelivery receives at the end, so an
// Observer can start a span here and end it there (see package tracing).
// It is called exactly once before each ObserveDelivery, except for a
// call refused before it began (a nil function in package once). It must
// be fast and safe for concurrent use.
type DeliveryStarter interface {
	StartDelivery(ctx context.Context, d Delivery) context.Context
}

// Observer receives the outcome of every delivery: the extension point
// for metrics (metrics.Metrics implements it) and tracing (tracing.Tracer
// does). It is called synchronously after the delivery ended, with the
// context StartDelivery returned (or the delivery's own when the
// Observer is no DeliveryStarter), so it must be fast and safe for
// concurrent use. An Observer that panics is logged and the delivery
// goes on.
//
// Every entry point takes one in its config. Without one, nothing is
// reported and no span is started; the trace context of a message (its
// W3C traceparent) is still carried on to the handler and to its output
// messages.
type Observer interface {
	ObserveDelivery(ctx context.Context, d Delivery)
}

// Observers returns an Observer reporting to every one of obs, in turn;
// each that implements DeliveryStarter starts the delivery in the
// context the one before returned. Nil entries are skipped. Use it to
// give one entry point metrics and tracing:
// Observers(m, tracing.New(tp)).
func Observers(obs ...Observer) Observer { return observers(obs) }

type observers []Observer

func (o observers) ObserveDelivery(ctx context.Context, d Delivery) {
	fanout.Report(ctx, o, d, Observer.ObserveDelivery)
}

func (o observers) StartDelivery(ctx context.Context, d Delivery) context.Context {
	return fanout.Start(ctx, o, d, DeliveryStarter.StartDelivery)
}
