// Package idempotency is the vocabulary every entry point of
// watermill-idempotent shares: the inbox (package middleware, the
// Watermill adapter), package once, package httpidem and the outbox.
//
// It defines what a delivery is and how it ended (Delivery, Outcome,
// Mode), how to watch deliveries (Observer, DeliveryStarter, Observers;
// packages metrics and tracing implement them), the errors that retrying
// cannot fix and IsPermanent to recognise them, the policies and defaults
// of two-phase calls (ExpiredLeasePolicy, FinishRetry, DefaultLease,
// DefaultRetention), and what a handler reads from its context
// (KeyFromContext, ScopeFromContext) to derive keys for the calls it
// makes downstream (Derive).
//
// It depends on no transport: nothing here knows Watermill messages or
// HTTP requests.
package idempotency
