package middleware

import (
	"context"
	"database/sql"
)

type ctxKey int

const (
	txKey ctxKey = iota
	dedupKey
	scopeKey
	inTxKey
)

// withInboxTx marks ctx as inside an inbox transaction, whatever driver
// runs it.
func withInboxTx(ctx context.Context) context.Context {
	return context.WithValue(ctx, inTxKey, true)
}

func inInboxTx(ctx context.Context) bool {
	in, _ := ctx.Value(inTxKey).(bool)
	return in
}

func withTx(ctx context.Context, tx *sql.Tx) context.Context {
	return context.WithValue(ctx, txKey, tx)
}

func withKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, dedupKey, key)
}

func withScope(ctx context.Context, scope string) context.Context {
	return context.WithValue(ctx, scopeKey, scope)
}

// TxFromContext returns the inbox transaction of the message being handled:
// use msg.Context(). Writes made through it commit or roll back together
// with the deduplication marker. Handlers must not commit or roll it back
// themselves. ok is false outside an inbox handler.
func TxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	tx, ok = ctx.Value(txKey).(*sql.Tx)
	return tx, ok && tx != nil
}

// KeyFromContext returns the deduplication key of the message being
// handled, for propagating it downstream (an Idempotency-Key header, a
// child key). ok is false outside an inbox handler.
func KeyFromContext(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(dedupKey).(string)
	return key, ok && key != ""
}

// ScopeFromContext returns the scope of the message being handled: the
// consumer part of the (consumer, key) its record is stored under —
// Consumer + ScopeSeparator + handler name, a HandlerScopes entry, or
// Consumer alone outside a router (see Config).
// Use it to name what the handler derives per scope, as the inbox does
// with OutputUUID(scope, key, position). ok is false outside an inbox
// handler.
func ScopeFromContext(ctx context.Context) (scope string, ok bool) {
	scope, ok = ctx.Value(scopeKey).(string)
	return scope, ok && scope != ""
}
