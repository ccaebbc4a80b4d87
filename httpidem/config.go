package httpidem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/lease"
	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Defaults of Config.
const (
	DefaultMaxKeyLength     = 255
	DefaultMaxBodyBytes     = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
	DefaultRetention        = 24 * time.Hour
	DefaultRetryAfter       = time.Second
)

// DefaultMethods are the methods made idempotent by default: the ones
// HTTP does not make idempotent by definition.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultReplayHeaders are the response headers stored and replayed by
// default. Headers that describe one transfer or one moment (Date,
// Content-Length, Set-Cookie, tracing headers) are not replayed.
var DefaultReplayHeaders = []string{"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified"}

// DefaultStore stores the final responses that describe the request
// rather than the moment: 2xx, 3xx and 4xx, except 401 and 403 (the
// credentials may change), 408, 409, 425 and 429 (the client should try
// again). Never 5xx: a retry after a server error runs the handler again.
func DefaultStore(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout,
		http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// Config configures an Idempotency middleware.
type Config struct {
	// Repository stores the keys and responses: any repository.TwoPhase
	// backend (memory, redis, postgres, mysql, sqlite). Required.
	Repository repository.TwoPhase
	// Principal returns the authenticated client of the request (a user
	// or API-client id set by the authentication middleware that runs
	// before this one). Keys are stored per principal, so a client that
	// sends another client's key never gets the other's response. An
	// error or an empty principal answers 401. Required unless Global.
	Principal func(*http.Request) (string, error)
	// Global makes keys shared by every client, with no Principal: only
	// for services whose clients cannot see each other's keys (a single
	// trusted caller). Default: false.
	Global bool
	// Route names the route of the request; keys are also stored per
	// route. Default: r.Pattern (set when the middleware wraps a handler
	// registered on an http.ServeMux), else r.URL.Path.
	Route func(*http.Request) string
	// Namespace is the consumer (scope) of the stored records, so HTTP
	// keys never meet keys of the inboxes or of package once in a shared
	// table, and two services sharing a table never replay each other's
	// responses: set it to the name of this service ("orders-api").
	// Required; at most 255 bytes, valid UTF-8, no NUL byte. Keys stored
	// before it was required are under "http": set Namespace "http" to
	// keep them.
	Namespace string
	// Methods are the request methods made idempotent; requests with other
	// methods pass through untouched. Default: DefaultMethods (POST,
	// PATCH).
	Methods []string
	// OptionalKey lets a request of Methods without the Idempotency-Key
	// header through, without idempotency. Default: false (such a request
	// answers 400: the key is required).
	OptionalKey bool
	// MaxKeyLength is the longest key accepted, in bytes; longer answers
	// 400. Default: DefaultMaxKeyLength (255).
	MaxKeyLength int
	// MaxBodyBytes is the largest request body read for the fingerprint;
	// larger answers 413 without running the handler. Default:
	// DefaultMaxBodyBytes (1 MiB).
	MaxBodyBytes int64
	// MaxResponseBytes is the largest response body stored. A larger one
	// (or one the handler flushes) passes through to the client as it is
	// written, is not stored, and its key is released, so a retry runs
	// the handler again. Default: DefaultMaxResponseBytes (1 MiB).
	MaxResponseBytes int
	// Store decides which statuses are stored and replayed; for the
	// others the key is released and a retry runs the handler again.
	// Default: DefaultStore (2xx-4xx except 401, 403, 408, 409, 425, 429;
	// never 5xx).
	Store func(status int) bool
	// ReplayHeaders are the response headers stored and replayed.
	// Default: DefaultReplayHeaders.
	ReplayHeaders []string
	// RetryAfter is sent in the Retry-After header (whole seconds, at
	// least 1) of a 409 for a request still in flight. Default:
	// DefaultRetryAfter (1 s).
	RetryAfter time.Duration
	// Lease, ExtendEvery and OnExpiredLease work as in
	// middleware.TwoPhaseConfig: a handler's claim is extended every
	// ExtendEvery while it runs; a claim whose lease expired (the server
	// crashed mid-request) is reclaimed and the handler runs again
	// (idempotency.Reclaim), or answers 409 with a problem of type
	// ProblemNeedsIntervention and no Retry-After (idempotency.Intervene,
	// the default) until an operator resolves the record. Defaults:
	// idempotency.DefaultLease (30 s), Lease/3, Intervene.
	Lease          time.Duration
	ExtendEvery    time.Duration
	OnExpiredLease idempotency.ExpiredLeasePolicy
	// StoreTimeout bounds each store call of a request: the claim, every
	// lease extension and every attempt to store the response or release
	// the key. A hung call is abandoned after it, and a request waits for
	// the store for at most about 2 × StoreTimeout besides the handler's
	// time: storing the response (or releasing the key) goes on in the
	// background after that (see Idempotency.Drain), and a store that
	// does not answer the claim is a 503 within StoreTimeout. Default:
	// Lease/3, as in middleware.TwoPhaseConfig. Must be shorter than
	// Lease.
	StoreTimeout time.Duration
	// FinishRetry bounds how storing the response (and releasing the key
	// after a response that is not stored) is retried after a store
	// error, while the lease is held, as in middleware.TwoPhaseConfig: one
	// dropped connection after the handler ran neither runs it twice nor
	// strands the key. The client waits for the retries. Default: see
	// idempotency.FinishRetry.
	FinishRetry idempotency.FinishRetry
	// Retention is how long a key and its response are kept. Default:
	// DefaultRetention (24 h).
	Retention time.Duration
	// Observer receives one idempotency.Delivery per request of Methods
	// that carries a key or must, with Scope Namespace, Mode ModeHTTP and
	// Operation the route (Route's), and these
	// outcomes: processed (the handler ran, its response is stored),
	// replayed (a stored response sent again), lease_busy (409 in
	// flight), payload_mismatch (422), needs_intervention (409),
	// no_key (400, missing or malformed key), no_scope (401), failed
	// (the response was not stored and the key released — a status Store
	// refuses, an oversized or streamed body, a panic — or 413, or 503
	// when the store failed). Claim is the time until the handler
	// started (the whole time when it did not run). metrics.Metrics
	// implements it: the requests appear in deliveries_total and
	// claim_duration_seconds under consumer Namespace. An Observer that
	// is an idempotency.DeliveryStarter starts each request before its key
	// is claimed, in the request context's span or its traceparent
	// header, and the handler runs in the context it returns:
	// tracing.New(tp) gives each request a span,
	// "idempotency <route>", with the handler's spans under it and the
	// response's http.response.status_code.
	// Default: none (no reports, no spans).
	Observer idempotency.Observer
	// Logger receives the logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Route == nil {
		c.Route = defaultRoute
	}
	if c.Methods == nil {
		c.Methods = DefaultMethods
	}
	settings.Default(&c.MaxKeyLength, DefaultMaxKeyLength)
	settings.Default(&c.MaxBodyBytes, DefaultMaxBodyBytes)
	settings.Default(&c.MaxResponseBytes, DefaultMaxResponseBytes)
	if c.Store == nil {
		c.Store = DefaultStore
	}
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = DefaultReplayHeaders
	}
	settings.Default(&c.RetryAfter, DefaultRetryAfter)
	// The lease settings' defaults are once's, written in one place.
	lease.Fill(&c.Lease, &c.ExtendEvery, &c.StoreTimeout, (*lease.Retry)(&c.FinishRetry))
	protocol.SetDefaults(&c.Retention, DefaultRetention, &c.Logger, &c.Now)
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Repository == nil {
		errs = append(errs, errors.New("missing Config.Repository"))
	}
	switch {
	case c.Principal == nil && !c.Global:
		errs = append(errs, errors.New("missing Config.Principal: keys must be scoped by the authenticated client, "+
			"or else one client could replay another's response; set Global only if keys may be shared by every client"))
	case c.Principal != nil && c.Global:
		errs = append(errs, errors.New("config.Principal and Global are exclusive"))
	}
	if len(c.Methods) == 0 {
		errs = append(errs, errors.New("config.Methods is empty"))
	}
	for _, m := range c.Methods {
		if !isToken(m) || strings.ToUpper(m) != m {
			errs = append(errs, fmt.Errorf("config.Methods: %q is not an upper-case method", m))
		}
	}
	errs = append(errs, settings.Positive("config.MaxKeyLength", c.MaxKeyLength))
	errs = append(errs, settings.Positive("config.MaxBodyBytes", c.MaxBodyBytes))
	errs = append(errs, settings.Positive("config.MaxResponseBytes", c.MaxResponseBytes))
	if c.RetryAfter < 0 {
		errs = append(errs, fmt.Errorf("config.RetryAfter must not be negative, got %s", c.RetryAfter))
	}
	switch err := protocol.CheckScope(c.Namespace); {
	case c.Namespace == "":
		errs = append(errs, errors.New("missing Config.Namespace: set it to the name of this service (\"orders-api\"), "+
			"so that services sharing the table never replay each other's responses (before it was required, keys were stored under \"http\")"))
	case err != nil:
		errs = append(errs, fmt.Errorf("config.Namespace %w", err))
	}
	// Lease, ExtendEvery, OnExpiredLease, StoreTimeout, FinishRetry and
	// Retention are once's settings: its Validate is the one rule for
	// them (the Namespace, its Scope, is checked above).
	if c.Repository != nil {
		oc := c.onceConfig()
		oc.Scope = "namespace"
		if err := oc.Validate(); err != nil {
			// Drop once's "invalid once config:" prefix when it has one.
			if inner := errors.Unwrap(err); inner != nil {
				err = inner
			}
			errs = append(errs, err)
		}
	}
	return settings.Invalid("httpidem", errs)
}

// onceConfig is the configuration of the once.TwoPhase that stores keys.
func (c Config) onceConfig() once.TwoPhaseConfig {
	return once.TwoPhaseConfig{
		Repository: c.Repository, Scope: c.Namespace,
		Lease: c.Lease, ExtendEvery: c.ExtendEvery, OnExpiredLease: c.OnExpiredLease,
		StoreTimeout: c.StoreTimeout, FinishRetry: c.FinishRetry,
		Retention: c.Retention, Logger: c.Logger, Now: c.Now,
	}
}

// isToken reports whether s is an HTTP token (RFC 9110, section 5.6.2),
// the syntax of a method.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}
