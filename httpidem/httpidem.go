package httpidem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/once"
)

// Header names.
const (
	// HeaderKey carries the client's idempotency key; Transport sets it.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on a replayed response.
	HeaderReplayed = "Idempotent-Replayed"
)

// Problem types (RFC 9457 "type" members) of the middleware's own
// answers, which are application/problem+json.
const (
	ProblemKeyMissing        = "https://github.com/idemkit/watermill-idempotent/docs/http.md#key-missing"
	ProblemKeyInvalid        = "https://github.com/idemkit/watermill-idempotent/docs/http.md#key-invalid"
	ProblemInFlight          = "https://github.com/idemkit/watermill-idempotent/docs/http.md#in-flight"
	ProblemKeyReused         = "https://github.com/idemkit/watermill-idempotent/docs/http.md#key-reused"
	ProblemNeedsIntervention = "https://github.com/idemkit/watermill-idempotent/docs/http.md#needs-intervention"
	ProblemNoPrincipal       = "https://github.com/idemkit/watermill-idempotent/docs/http.md#no-principal"
	ProblemBodyTooLarge      = "https://github.com/idemkit/watermill-idempotent/docs/http.md#body-too-large"
	ProblemStoreUnavailable  = "https://github.com/idemkit/watermill-idempotent/docs/http.md#store-unavailable"
)

// Idempotency is net/http middleware implementing the server side of the
// Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header) on
// the stores of the two-phase inbox. For a request whose method is in
// Config.Methods:
//
//   - no key: 400 (unless OptionalKey); a malformed or too long key: 400;
//   - no principal: 401; a body over MaxBodyBytes: 413;
//   - first request with a key: the handler runs under a lease (extended
//     while it runs); a response Store allows, with a body of at most
//     MaxResponseBytes, is stored with its ReplayHeaders and sent;
//     any other response is sent and the key released, so a retry runs
//     the handler again; a panic releases the key and is re-raised;
//   - the same key, principal, route and fingerprint (method, path and
//     query, body hash) after completion: the stored status, headers and
//     body again, with Idempotent-Replayed: true, without running the
//     handler;
//   - the same key while the first request is in flight: 409 with
//     Retry-After;
//   - the same key with another fingerprint: 422;
//   - a key whose earlier request died mid-run (lease expired):
//     OnExpiredLease — run again, or 409 needs-intervention;
//   - the store fails before the handler ran: 503 with Retry-After, the
//     handler does not run;
//   - storing the response fails after the handler ran: retried as
//     Config.FinishRetry allows while the lease is held (a write that
//     committed with its answer lost counts as stored), so a retry gets
//     the response replayed; only if every attempt fails is the response
//     sent unstored.
//
// Every store call is bounded by Config.StoreTimeout; a lease extension
// still in flight when the handler returns is abandoned, not waited for.
// Keys are stored per (principal, route, key) under the consumer
// Namespace. Every request of Methods that carries a key, or must, is
// reported to Config.Observer as a idempotency.Delivery (see
// Config.Observer for the outcomes and spans). Idempotency is safe for
// concurrent use.
type Idempotency struct {
	once   *once.TwoPhase
	config Config
}

// New validates config and returns the middleware.
func New(config Config) (*Idempotency, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	o, err := once.NewTwoPhase(config.onceConfig())
	if err != nil {
		return nil, fmt.Errorf("invalid httpidem config: %w", err)
	}
	config.ReplayHeaders = slices.Clone(config.ReplayHeaders)
	for i, h := range config.ReplayHeaders {
		config.ReplayHeaders[i] = http.CanonicalHeaderKey(h)
	}
	return &Idempotency{config: config, once: o}, nil
}

// Drain waits until the store writes that earlier requests left running
// in the background have ended, or ctx ends (its error then): a request
// waits for the store for at most about 2 × StoreTimeout besides its
// handler's time (see once.TwoPhase.Drain). Call it after the server has
// shut down.
func (m *Idempotency) Drain(ctx context.Context) error { return m.once.Drain(ctx) }

// Middleware wraps next.
func (m *Idempotency) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(next, w, r)
	})
}

// errNotStored carries a response that ran but must not be stored.
var errNotStored = errors.New("response not stored")

func (m *Idempotency) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	c := m.config
	if !slices.Contains(c.Methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	key, present, err := parseKey(r.Header.Values(HeaderKey), c.MaxKeyLength)
	if !present && c.OptionalKey {
		next.ServeHTTP(w, r)
		return
	}
	route := c.Route(r)
	obs, ctx := m.begin(r, route)
	ended := false
	end := func(outcome idempotency.Outcome, status int, err error) {
		ended = true
		obs.end(ctx, outcome, status, err)
	}
	defer func() {
		if !ended { // the handler panicked; the key is released
			end(idempotency.OutcomeFailed, http.StatusInternalServerError, errors.New("handler panicked"))
		}
	}()
	principal, body, ok := m.admit(w, r, key, present, err, end)
	if !ok {
		return
	}
	obs.setKey(key)
	storeKey := lengthPrefixed(principal) + lengthPrefixed(route) + key
	fields := watermill.LogFields{"principal": principal, "route": route, "key": key}

	var rec *recorder
	res, err := m.once.DoInput(ctx, storeKey, fingerprint(r.Method, r.URL.RequestURI(), body), func(ctx context.Context) ([]byte, error) {
		obs.handlerStarted()
		rec = &recorder{w: w, limit: c.MaxResponseBytes}
		req := r.WithContext(ctx)
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
		next.ServeHTTP(rec, req)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		if rec.passthrough || !c.Store(rec.status) {
			return nil, errNotStored
		}
		return m.encode(rec)
	})
	m.answer(w, rec, res, err, fields, end)
}

// admit checks a request of Methods before it runs: its key (parsed by
// parseKey), its principal and its body, which it reads. A request that
// fails a check is answered and ended, and ok is false.
func (m *Idempotency) admit(w http.ResponseWriter, r *http.Request, key string, present bool, keyErr error, end func(idempotency.Outcome, int, error)) (principal string, body []byte, ok bool) {
	c := m.config
	switch {
	case !present:
		problem(w, http.StatusBadRequest, ProblemKeyMissing, "Idempotency-Key is missing",
			fmt.Sprintf("%s %s requires an Idempotency-Key header.", r.Method, r.URL.Path), nil)
		end(idempotency.OutcomeNoKey, http.StatusBadRequest, fmt.Errorf("%w: no Idempotency-Key header", idempotency.ErrNoKey))
		return "", nil, false
	case keyErr != nil:
		problem(w, http.StatusBadRequest, ProblemKeyInvalid, "Idempotency-Key is invalid", keyErr.Error(), nil)
		end(idempotency.OutcomeNoKey, http.StatusBadRequest, fmt.Errorf("%w: %w", idempotency.ErrNoKey, keyErr))
		return "", nil, false
	}
	if !c.Global {
		var err error
		principal, err = c.Principal(r)
		if err != nil || principal == "" {
			problem(w, http.StatusUnauthorized, ProblemNoPrincipal, "No authenticated client",
				"An Idempotency-Key is kept per client, and this request has none.", nil)
			end(idempotency.OutcomeNoScope, http.StatusUnauthorized, fmt.Errorf("%w: no authenticated client: %w", idempotency.ErrNoScope, err))
			return "", nil, false
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, c.MaxBodyBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, ProblemKeyInvalid, "Could not read the request body", err.Error(), nil)
		end(idempotency.OutcomeFailed, http.StatusBadRequest, err)
		return "", nil, false
	}
	if int64(len(body)) > c.MaxBodyBytes {
		problem(w, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("Requests with an Idempotency-Key may carry at most %d bytes.", c.MaxBodyBytes), nil)
		end(idempotency.OutcomeFailed, http.StatusRequestEntityTooLarge, fmt.Errorf("request body over %d bytes", c.MaxBodyBytes))
		return "", nil, false
	}
	_ = r.Body.Close()
	return principal, body, true
}

// answer sends the response of a request once does answered: the
// handler's (rec, when it ran), a replayed one, or a problem.
func (m *Idempotency) answer(w http.ResponseWriter, rec *recorder, res once.Result, err error, fields watermill.LogFields, end func(idempotency.Outcome, int, error)) {
	c := m.config
	switch {
	case rec != nil:
		// The handler ran: its response goes out whatever the store said.
		outcome := idempotency.OutcomeProcessed
		switch {
		case errors.Is(err, errNotStored):
			outcome, err = idempotency.OutcomeFailed, fmt.Errorf("response with status %d %w: the key is released", rec.status, errNotStored)
		case err != nil:
			outcome = idempotency.OutcomeFailed
			c.Logger.Error("Idempotency: the handler ran but its response could not be stored; a retry meets the store's state then", err, fields)
		}
		rec.finish()
		end(outcome, rec.status, err)
	case err == nil:
		status := m.replay(w, res.Value, fields)
		outcome := idempotency.OutcomeReplayed
		if status == http.StatusInternalServerError {
			outcome, err = idempotency.OutcomeFailed, errors.New("stored response unreadable")
		}
		end(outcome, status, err)
	case errors.Is(err, idempotency.ErrPayloadMismatch):
		problem(w, http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency-Key is already used",
			"This Idempotency-Key was used with another request (method, path or body).", nil)
		end(idempotency.OutcomePayloadMismatch, http.StatusUnprocessableEntity, err)
	case errors.Is(err, idempotency.ErrNeedsIntervention):
		problem(w, http.StatusConflict, ProblemNeedsIntervention, "An earlier request with this Idempotency-Key stopped mid-run",
			"Its outcome is unknown; an operator must resolve it before the key can be used again.", nil)
		end(idempotency.OutcomeNeedsIntervention, http.StatusConflict, err)
	case errors.Is(err, idempotency.ErrInProgress):
		problem(w, http.StatusConflict, ProblemInFlight, "A request with this Idempotency-Key is in flight",
			"Retry after the earlier request has completed.", retryAfter(c.RetryAfter))
		end(idempotency.OutcomeLeaseBusy, http.StatusConflict, err)
	default:
		c.Logger.Error("Idempotency: store failed; the handler did not run", err, fields)
		problem(w, http.StatusServiceUnavailable, ProblemStoreUnavailable, "Idempotency store unavailable",
			"The request was not processed; retry it with the same Idempotency-Key.", retryAfter(c.RetryAfter))
		end(idempotency.OutcomeFailed, http.StatusServiceUnavailable, err)
	}
}

func retryAfter(d time.Duration) http.Header {
	secs := int(math.Ceil(d.Seconds()))
	if secs < 1 {
		secs = 1
	}
	return http.Header{"Retry-After": {strconv.Itoa(secs)}}
}

// parseKey reads the Idempotency-Key field: an sf-string per the draft
// (`"8e03978e-…"`); a bare token is accepted too, as many clients send
// one. present is false when there is no non-empty field.
func parseKey(values []string, maxLen int) (key string, present bool, err error) {
	var nonEmpty []string
	for _, v := range values {
		if v = strings.TrimSpace(v); v != "" {
			nonEmpty = append(nonEmpty, v)
		}
	}
	switch len(nonEmpty) {
	case 0:
		return "", false, nil
	case 1:
	default:
		return "", true, errors.New("Idempotency-Key must be sent once")
	}
	v := nonEmpty[0]
	if strings.HasPrefix(v, `"`) {
		var b strings.Builder
		closed := false
		for i := 1; i < len(v); i++ {
			ch := v[i]
			if ch == '\\' && i+1 < len(v) && (v[i+1] == '"' || v[i+1] == '\\') {
				b.WriteByte(v[i+1])
				i++
				continue
			}
			if ch == '"' {
				if i != len(v)-1 {
					return "", true, errors.New("Idempotency-Key: text after the closing quote")
				}
				closed = true
				break
			}
			b.WriteByte(ch)
		}
		if !closed {
			return "", true, errors.New("Idempotency-Key: unterminated string")
		}
		v = b.String()
	}
	if v == "" {
		return "", true, errors.New("Idempotency-Key is empty")
	}
	if len(v) > maxLen {
		return "", true, fmt.Errorf("Idempotency-Key is %d bytes, longer than %d", len(v), maxLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", true, errors.New("Idempotency-Key must be printable ASCII")
		}
	}
	return v, true, nil
}

// fingerprint identifies what a request asks for: its method, its request
// URI (path and query) and the SHA-256 of its body; a key sent again with
// another fingerprint answers 422. The encoding is unambiguous because
// method is a token (Config.Validate admits no other method to Methods,
// and requests of other methods never get here), so it holds no line
// feed, and the hash has a fixed length: two requests share a
// fingerprint only if all three parts are equal.
func fingerprint(method, requestURI string, body []byte) []byte {
	h := sha256.Sum256(body)
	return []byte(method + "\n" + requestURI + "\n" + hex.EncodeToString(h[:]))
}

func lengthPrefixed(s string) string { return strconv.Itoa(len(s)) + ":" + s }

// stored is the encoded form of a stored response.
type stored struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

func (m *Idempotency) encode(rec *recorder) ([]byte, error) {
	s := stored{Status: rec.status, Body: rec.buf.Bytes()}
	h := rec.w.Header()
	for _, name := range m.config.ReplayHeaders {
		if vs := h.Values(name); len(vs) > 0 {
			if s.Header == nil {
				s.Header = http.Header{}
			}
			s.Header[name] = slices.Clone(vs)
		}
	}
	return json.Marshal(s)
}

// replay sends a stored response and returns its status, or answers 500
// if it is unreadable.
func (m *Idempotency) replay(w http.ResponseWriter, value []byte, fields watermill.LogFields) int {
	var s stored
	if err := json.Unmarshal(value, &s); err != nil || s.Status == 0 {
		m.config.Logger.Error("Idempotency: stored response is unreadable", fmt.Errorf("decode: %w", err), fields)
		problem(w, http.StatusInternalServerError, ProblemStoreUnavailable, "Stored response unreadable", "", nil)
		return http.StatusInternalServerError
	}
	for name, vs := range s.Header {
		w.Header()[name] = vs
	}
	w.Header().Set(HeaderReplayed, "true")
	w.WriteHeader(s.Status)
	_, _ = w.Write(s.Body)
	return s.Status
}

func problem(w http.ResponseWriter, status int, typ, title, detail string, extra http.Header) {
	for name, vs := range extra {
		w.Header()[name] = vs
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": typ, "title": title, "status": status, "detail": detail})
}

// recorder buffers a handler's response until it is known whether it is
// stored; a response that outgrows the limit, or is flushed, switches to
// passing through.
type recorder struct {
	w           http.ResponseWriter
	limit       int
	status      int
	buf         bytes.Buffer
	passthrough bool
}

// Header returns the real header map: nothing reaches the client before
// finish or the switch to passing through.
func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	if r.status != 0 {
		return
	}
	if code < 200 {
		if r.passthrough {
			r.w.WriteHeader(code)
		}
		return // informational: not part of the stored response
	}
	r.status = code
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.passthrough && r.buf.Len()+len(p) > r.limit {
		r.startPassthrough()
	}
	if r.passthrough {
		return r.w.Write(p)
	}
	return r.buf.Write(p)
}

// Flush switches to passing through: a streamed response is not stored.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if !r.passthrough {
		r.startPassthrough()
	}
	if f, ok := r.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) startPassthrough() {
	r.passthrough = true
	r.w.WriteHeader(r.status)
	_, _ = r.w.Write(r.buf.Bytes())
	r.buf = bytes.Buffer{}
}

// finish sends a buffered response.
func (r *recorder) finish() {
	if r.passthrough {
		return
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.w.WriteHeader(r.status)
	_, _ = r.w.Write(r.buf.Bytes())
}
