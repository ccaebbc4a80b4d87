// Package tracing gives the module's entry points OpenTelemetry spans. A
// Tracer is an Observer of each of them — the inbox in its three modes,
// package once, package httpidem, the outbox relay and the janitor — and
// implements their start parts, so it starts a span when a delivery (a
// call, a request, a batch) begins and ends it with the outcome.
//
//	tracer := tracing.New(tp) // nil: otel.GetTracerProvider()
//	inbox, err := middleware.NewInbox(middleware.Config{…, Observer: tracer})
//
//	// With metrics too:
//	inbox, err := middleware.NewInbox(middleware.Config{…,
//		Observer: idempotency.Observers(m, tracer)})
//	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{…,
//		Observer: outbox.RelayObservers(m, tracer)})
//	j, err := janitor.NewJanitor(repo, janitor.Config{…,
//		Observer: janitor.Observers(m, tracer)})
//
// Without a Tracer among its observers an entry point starts no span.
// It still carries the trace on: a delivery's handler runs in the trace
// context of the message's W3C traceparent metadata, and the messages it
// returns carry it on; httpidem's handler runs in the request's.
//
// The spans:
//
//   - "inbox <consumer>" (kind consumer) per delivery of middleware.Inbox,
//     TwoPhaseInbox and NaturalKey; "once <scope>" (internal) per call of
//     package once; "idempotency <route>" (internal) per request of
//     package httpidem. A child of the message's (request's) trace; the
//     handler (fn) runs in it, so its own spans nest below. Attributes:
//     idempotency.consumer, .mode, .key, .outcome and .replayed,
//     messaging.message.id (inbox), http.route and
//     http.response.status_code (httpidem); a failed outcome records the
//     error and sets the status to Error.
//   - "outbox relay <name>" (internal) per relay batch, with
//     outbox.relay, .claimed, .published and .dead_lettered; the
//     messages it publishes carry it in their context. It begins once
//     the batch has claimed rows, so an idle relay makes no spans; a
//     batch that fails before claiming (the database unreachable) gets
//     one with the error.
//   - "janitor delete expired" (internal) per janitor batch, with
//     janitor.deleted.
//
// Attributes known only at the end are set on recording spans only, and
// a no-op TracerProvider starts nothing at all. The package uses the
// OpenTelemetry trace API alone: bring the SDK, an exporter and a
// TracerProvider of your own.
package tracing
