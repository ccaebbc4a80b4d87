package middleware

import (
	"context"
	"database/sql"

	"github.com/idemkit/watermill-idempotent/internal/ctxkeys"
)

type ctxKey int

const (
	txKey ctxKey = iota
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
	return ctxkeys.WithKey(ctx, key)
}

func withScope(ctx context.Context, scope string) context.Context {
	return ctxkeys.WithScope(ctx, scope)
}

// TxFromContext returns the inbox transaction of the message being handled:
// use msg.Context(). Writes made through it commit or roll back together
// with the deduplication marker. Handlers must not commit or roll it back
// themselves. ok is false outside an inbox handler.
func TxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	tx, ok = ctx.Value(txKey).(*sql.Tx)
	return tx, ok && tx != nil
}
