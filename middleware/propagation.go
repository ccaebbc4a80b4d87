package middleware

import (
	"context"
	"net/http"
	"strconv"

	"github.com/google/uuid"
)

// namespace is the UUIDv5 namespace of every identifier derived here, so
// derived values never collide with other name-based UUIDs.
var namespace = uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/idemkit/watermill-idempotent"))

// Derive returns a child key for one downstream call made while handling
// the message with key parent: a name-based UUID (version 5) of the parent
// and the call's name. The same parent and name always give the same key —
// on a redelivery, on another instance, after a crash — and different
// names give different keys, so each downstream layer can dedupe its own
// step:
//
//	key, _ := middleware.KeyFromContext(msg.Context())
//	chargeKey := middleware.Derive(key, "charge-card")
//	emailKey := middleware.Derive(key, "send-receipt")
func Derive(parent, name string) string {
	return uuid.NewSHA1(namespace, []byte(strconv.Itoa(len(parent))+":"+parent+":"+name)).String()
}

// OutputUUID returns the deterministic UUID of the message at position
// (0-based) among those a consumer produces while handling the message
// with the given deduplication key. A re-run of the handler produces the
// same UUIDs, so downstream inboxes dedupe every repeat.
func OutputUUID(consumer, key string, position int) string {
	return Derive(strconv.Itoa(len(consumer))+":"+consumer+":"+key, "output-"+strconv.Itoa(position))
}

// IdempotencyKeyHeader is the HTTP header IdempotencyTransport sets.
const IdempotencyKeyHeader = "Idempotency-Key"

type idempotencyNameKey struct{}

// WithIdempotencyName names the downstream call made with ctx, so that
// IdempotencyTransport sends Derive(key, name) instead of the bare key.
// Use one name per distinct call a handler makes.
func WithIdempotencyName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, idempotencyNameKey{}, name)
}

// IdempotencyTransport is an http.RoundTripper that sets the
// Idempotency-Key header of requests made inside an inbox handler (with a
// context derived from msg.Context()): the message's deduplication key, or
// Derive(key, name) when the context carries a name from
// WithIdempotencyName. A request that already has the header, or whose
// context has no key, is sent unchanged. The request passed in is never
// modified; a clone carries the header.
//
//	client := &http.Client{Transport: &middleware.IdempotencyTransport{}}
//	req, _ := http.NewRequestWithContext(middleware.WithIdempotencyName(msg.Context(), "charge"), "POST", url, body)
//	resp, err := client.Do(req)
type IdempotencyTransport struct {
	// Base sends the requests. Default: http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *IdempotencyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	ctx := req.Context()
	key, ok := KeyFromContext(ctx)
	if !ok || req.Header.Get(IdempotencyKeyHeader) != "" {
		return base.RoundTrip(req)
	}
	if name, ok := ctx.Value(idempotencyNameKey{}).(string); ok && name != "" {
		key = Derive(key, name)
	}
	clone := req.Clone(ctx)
	clone.Header.Set(IdempotencyKeyHeader, key)
	return base.RoundTrip(clone)
}
