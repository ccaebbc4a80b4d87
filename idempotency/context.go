package idempotency

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"

	"github.com/google/uuid"

	"github.com/idemkit/watermill-idempotent/internal/ctxkeys"
)

// KeyFromContext returns the deduplication key of the delivery being
// handled — in an inbox handler (msg.Context()), a once function or an
// httpidem handler — for propagating it downstream (an Idempotency-Key
// header, a child key with Derive). ok is false outside one.
func KeyFromContext(ctx context.Context) (key string, ok bool) {
	return ctxkeys.Key(ctx)
}

// ScopeFromContext returns the scope of the delivery being handled: the
// scope part of the (scope, key) its record is stored under (for the
// inbox, Consumer + "/" + handler name, a HandlerScopes entry, or
// Consumer alone outside a router). Use it to name what the handler
// derives per scope, as the inbox does with middleware.OutputUUID. ok is
// false outside a handler.
func ScopeFromContext(ctx context.Context) (scope string, ok bool) {
	return ctxkeys.Scope(ctx)
}

// ErrNoTransaction is returned by Tx when the context carries no
// transaction: the code does not run inside the transactional inbox
// (middleware.NewInbox) or a once.Transactional function, or the context
// is not the one they passed (use msg.Context()).
var ErrNoTransaction = errors.New("no inbox transaction in context")

// Tx returns the transaction the call being handled runs in: in a
// handler of the transactional inbox, msg.Context(); in a
// once.Transactional function, its ctx. Writes made through it commit or
// roll back together with the deduplication marker; do not commit or
// roll it back. TTx is the driver's transaction type — *sql.Tx with a
// database/sql repository, pgx.Tx with postgres.NewPgxRepository:
//
//	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
//	if err != nil {
//		return nil, err
//	}
//	_, err = tx.ExecContext(msg.Context(), "UPDATE accounts SET balance = balance - $1 WHERE id = $2", amount, id)
//
// Outside such a call it returns an error wrapping ErrNoTransaction, and
// for a TTx other than the driver's one that names both types: a handler
// returns it, and the message is retried, never run without the
// transaction.
func Tx[TTx any](ctx context.Context) (TTx, error) {
	var zero TTx
	v, ok := ctxkeys.Tx(ctx)
	if !ok {
		return zero, ErrNoTransaction
	}
	tx, ok := v.(TTx)
	if !ok {
		return zero, fmt.Errorf("%w of type %v: the inbox's transaction is a %T", ErrNoTransaction, reflect.TypeFor[TTx](), v)
	}
	return tx, nil
}

// namespace is the UUIDv5 namespace of every identifier derived here, so
// derived values never collide with other name-based UUIDs.
var namespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/idemkit/watermill-idempotent"))

// Derive returns a child key for one downstream call made while handling
// the delivery with key parent: a name-based UUID (version 5) of the
// parent and the call's name. The same parent and name always give the
// same key — on a redelivery, on another instance, after a crash — and
// different names give different keys, so each downstream layer can
// dedupe its own step:
//
//	key, _ := idempotency.KeyFromContext(msg.Context())
//	chargeKey := idempotency.Derive(key, "charge-card")
//	emailKey := idempotency.Derive(key, "send-receipt")
func Derive(parent, name string) string {
	return uuid.NewSHA1(namespace, []byte(strconv.Itoa(len(parent))+":"+parent+":"+name)).String()
}
