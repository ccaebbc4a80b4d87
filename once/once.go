package once

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Result is what Do returns for a call that did not fail.
type Result struct {
	// Value is the function's output: the bytes it returned in this call,
	// or the bytes stored by the call that ran it when Replayed is true.
	Value []byte
	// Replayed is true when the function did not run in this call because
	// an earlier call with the same key completed it.
	Replayed bool
}

// BusyError is returned (wrapping middleware.ErrInProgress) when another
// call holds the key in progress. It is transient: try again after
// LeaseUntil, when the other call has completed, released or expired.
type BusyError struct {
	Scope, Key string
	// Owner is the attempt holding the key; empty for a transactional
	// record some other two-phase user left in progress.
	Owner string
	// LeaseUntil is when the other call's lease runs out unless it is
	// extended; zero when unknown.
	LeaseUntil time.Time
}

func (e *BusyError) Error() string {
	if e.LeaseUntil.IsZero() {
		return fmt.Sprintf("%v: scope %q, key %q", middleware.ErrInProgress, e.Scope, e.Key)
	}
	return fmt.Sprintf("%v: scope %q, key %q is leased by %s until %s", middleware.ErrInProgress, e.Scope, e.Key, e.Owner, e.LeaseUntil.Format(time.RFC3339Nano))
}

// Unwrap makes errors.Is(err, middleware.ErrInProgress) true.
func (e *BusyError) Unwrap() error { return middleware.ErrInProgress }

// ErrNoKey is returned (wrapping middleware.ErrNoKey) for an empty key.
var ErrNoKey = fmt.Errorf("once: %w", middleware.ErrNoKey)

// checkScope tells why scope cannot be stored as a consumer, or nil.
func checkScope(field, scope string) error {
	switch {
	case scope == "":
		return fmt.Errorf("missing %s", field)
	case len(scope) > repository.MaxConsumerLength:
		return fmt.Errorf("%s is %d bytes, longer than %d", field, len(scope), repository.MaxConsumerLength)
	case !utf8.ValidString(scope):
		return fmt.Errorf("%s is not valid UTF-8", field)
	case strings.IndexByte(scope, 0) >= 0:
		return fmt.Errorf("%s contains a NUL byte", field)
	}
	return nil
}

// replay answers a call that found its key already claimed, as
// middleware's replay does for a duplicate: the stored output when the
// input matches and the record is completed, middleware.ErrPayloadMismatch
// when the input differs, *BusyError when the record is in progress.
func replay(scope, key string, hash []byte, rec repository.Record) (Result, error) {
	switch {
	case !bytes.Equal(rec.PayloadHash, hash):
		return Result{}, fmt.Errorf("%w: scope %q, key %q (first claimed at %s)", middleware.ErrPayloadMismatch, scope, key, rec.CreatedAt.Format(time.RFC3339))
	case rec.State != repository.StateCompleted:
		return Result{}, &BusyError{Scope: scope, Key: key, Owner: rec.LeaseOwner, LeaseUntil: rec.LeaseUntil}
	}
	return Result{Value: rec.Result, Replayed: true}, nil
}

// validateRetention checks the settings both configs share.
func validateRetention(retention time.Duration) []error {
	if retention <= 0 {
		return []error{fmt.Errorf("config.Retention must be positive, got %s", retention)}
	}
	return nil
}

// panicError carries a recovered panic through the release path.
type panicError struct{ value any }

func (p panicError) Error() string { return fmt.Sprintf("once: function panicked: %v", p.value) }

var errNilFunc = errors.New("once: nil function")

// keyCtx carries the key and scope of the running call to fn.
type keyCtx struct{}

type callInfo struct{ scope, key string }

func withCall(ctx context.Context, scope, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, callInfo{scope, key})
}

// KeyFromContext returns the key of the call running fn, for deriving
// downstream idempotency keys (middleware.Derive). ok is false outside Do.
func KeyFromContext(ctx context.Context) (key string, ok bool) {
	c, ok := ctx.Value(keyCtx{}).(callInfo)
	return c.key, ok && c.key != ""
}
