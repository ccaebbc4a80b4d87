package middleware

import (
	"context"

	"github.com/idemkit/watermill-idempotent/internal/ctxkeys"
)

type ctxKey int

const (
	inTxKey ctxKey = iota
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

func withKey(ctx context.Context, key string) context.Context {
	return ctxkeys.WithKey(ctx, key)
}

func withScope(ctx context.Context, scope string) context.Context {
	return ctxkeys.WithScope(ctx, scope)
}
