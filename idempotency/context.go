package idempotency

import (
	"context"
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
