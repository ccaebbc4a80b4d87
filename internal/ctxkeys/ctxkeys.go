// Package ctxkeys holds the context keys under which the entry points put
// the deduplication key and scope of the call being handled, so that
// package idempotency can read what package middleware wrote.
package ctxkeys

import "context"

type key int

const (
	dedupKey key = iota
	scopeKey
	txKey
)

// txBox holds a transaction, so that a nil one is still told apart from
// none.
type txBox struct{ tx any }

// WithTx returns ctx carrying the transaction of the call being handled
// (an inbox delivery, a once call), of whatever driver.
func WithTx(ctx context.Context, tx any) context.Context {
	return context.WithValue(ctx, txKey, txBox{tx})
}

// Tx returns the transaction WithTx put in ctx; ok is false for none.
func Tx(ctx context.Context) (tx any, ok bool) {
	b, ok := ctx.Value(txKey).(txBox)
	return b.tx, ok
}

// WithKey returns ctx carrying the deduplication key being handled.
func WithKey(ctx context.Context, k string) context.Context {
	return context.WithValue(ctx, dedupKey, k)
}

// WithScope returns ctx carrying the scope being handled.
func WithScope(ctx context.Context, scope string) context.Context {
	return context.WithValue(ctx, scopeKey, scope)
}

// Key returns the key WithKey put in ctx.
func Key(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(dedupKey).(string)
	return k, ok && k != ""
}

// Scope returns the scope WithScope put in ctx.
func Scope(ctx context.Context) (string, bool) {
	s, ok := ctx.Value(scopeKey).(string)
	return s, ok && s != ""
}
