package httpidem

import (
	"context"
	"net/http"

	"github.com/idemkit/watermill-idempotent/idempotency"
)

type callNameKey struct{}

// WithName names the downstream call made with ctx, so that Transport
// sends idempotency.Derive(key, name) instead of the bare key. Use one
// name per distinct call a handler makes.
func WithName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, callNameKey{}, name)
}

// Transport is the client side: an http.RoundTripper that sets the
// Idempotency-Key header (HeaderKey) of requests made inside an inbox
// handler (with a context derived from msg.Context()): the message's
// deduplication key, or idempotency.Derive(key, name) when the context
// carries a name from WithName. A request that already has the header,
// or whose context has no key, is sent unchanged. The request passed in
// is never modified; a clone carries the header.
//
//	client := &http.Client{Transport: &httpidem.Transport{}}
//	req, _ := http.NewRequestWithContext(httpidem.WithName(msg.Context(), "charge"), "POST", url, body)
//	resp, err := client.Do(req)
type Transport struct {
	// Base sends the requests. Default: http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	ctx := req.Context()
	key, ok := idempotency.KeyFromContext(ctx)
	if !ok || req.Header.Get(HeaderKey) != "" {
		return base.RoundTrip(req)
	}
	if name, ok := ctx.Value(callNameKey{}).(string); ok && name != "" {
		key = idempotency.Derive(key, name)
	}
	clone := req.Clone(ctx)
	clone.Header.Set(HeaderKey, key)
	return base.RoundTrip(clone)
}
