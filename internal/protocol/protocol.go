// Package protocol is the idempotency protocol, written once for every
// entry point — the transactional inbox and its group commit, the
// two-phase inbox, once (both modes) and httpidem (through once): claim
// the key, run the function, store its result, and answer a duplicate
// (replay it, refuse other input, ask to retry later, or handle an
// expired lease). The entry points keep only what is their own: how the
// key and input arrive and how the Answer is returned (a message, a
// Result, an HTTP response).
package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/internal/settings"
	"github.com/idemkit/watermill-idempotent/repository"
)

// The errors of a duplicate (repository's; package middleware exports
// them under the same names).
var (
	ErrPayloadMismatch   = repository.ErrPayloadMismatch
	ErrNeedsIntervention = repository.ErrNeedsIntervention
	ErrInProgress        = repository.ErrInProgress
)

// BusyError is the answer to a key held in progress by another call.
type BusyError = repository.BusyError

// Kind is how a call ended.
type Kind int

const (
	// Ran: the function ran; Err is its error, or the store's after it.
	Ran Kind = iota
	// Replay: an earlier call completed the key with the same input;
	// Record holds its stored result.
	Replay
	// Mismatch: the key was taken with other input; Err wraps
	// ErrPayloadMismatch.
	Mismatch
	// Busy: another call holds the key; Err is a *BusyError.
	Busy
	// NeedsIntervention: an earlier attempt's lease expired mid-run and the policy
	// asks for an operator; Err wraps ErrNeedsIntervention.
	NeedsIntervention
	// Unclaimed: the store failed before the function could run; Err.
	Unclaimed
)

// Answer is what the protocol did with one call.
type Answer struct {
	Kind   Kind
	Record repository.Record // the record found, for every answer to a duplicate
	Err    error
	// Panic is what the function panicked with (Kind Ran); the entry point
	// re-raises it once it has answered.
	Panic any
	// Claim is how long claiming the key took.
	Claim time.Duration
	// Result is the function's output (Kind Ran), stored with the key
	// unless Err is set.
	Result []byte
}

// Outcome names the answer as package middleware's Outcome values do:
// processed, replayed, payload_mismatch, lease_busy, needs_intervention
// or failed.
func (a Answer) Outcome() string {
	switch {
	case a.Kind == Ran && a.Err == nil:
		return "processed"
	case a.Kind == Replay:
		return "replayed"
	case a.Kind == Mismatch:
		return "payload_mismatch"
	case a.Kind == Busy:
		return "lease_busy"
	case a.Kind == NeedsIntervention:
		return "needs_intervention"
	}
	return "failed"
}

// Duplicate answers a call that found its key taken by rec: Replay when
// the input matches and the record is completed, Mismatch when the input
// differs, Busy when the record is still in progress.
func Duplicate(scope, key string, hash []byte, rec repository.Record) Answer {
	switch {
	case !bytes.Equal(rec.PayloadHash, hash):
		return Answer{Kind: Mismatch, Record: rec, Err: fmt.Errorf("%w: scope %q, key %q (first claimed at %s)", ErrPayloadMismatch, scope, key, rec.CreatedAt.Format(time.RFC3339))}
	case rec.State != repository.StateCompleted:
		return Answer{Kind: Busy, Record: rec, Err: &BusyError{Scope: scope, Key: key, Owner: rec.LeaseOwner, LeaseUntil: rec.LeaseUntil}}
	}
	return Answer{Kind: Replay, Record: rec}
}

// settled reports whether the answer to a call finding rec is Duplicate's
// whatever the lease says: the input differs, or the record is completed.
func settled(rec repository.Record, hash []byte) bool {
	return !bytes.Equal(rec.PayloadHash, hash) || rec.State == repository.StateCompleted
}

// SetDefaults fills the settings every entry point's config has: the
// retention (with the entry point's default), the logger
// (watermill.NopLogger) and the clock (time.Now).
func SetDefaults(retention *time.Duration, defaultRetention time.Duration, logger *watermill.LoggerAdapter, now *func() time.Time) {
	if *retention == 0 {
		*retention = defaultRetention
	}
	settings.Logger(logger)
	if *now == nil {
		*now = time.Now
	}
}

// ValidateRetention checks the retention of every entry point, and that
// it outlasts a declared redelivery window (0: none declared).
func ValidateRetention(retention, redeliveryWindow time.Duration) []error {
	var errs []error
	if retention <= 0 {
		errs = append(errs, fmt.Errorf("config.Retention must be positive, got %s", retention))
	}
	if redeliveryWindow < 0 {
		errs = append(errs, fmt.Errorf("config.RedeliveryWindow must not be negative, got %s", redeliveryWindow))
	}
	if retention > 0 && retention < redeliveryWindow {
		errs = append(errs, fmt.Errorf("config.Retention (%s) is shorter than RedeliveryWindow (%s): duplicates arriving after the marker expired would be processed again; raise Retention, or set RedeliveryWindow to the longest time your broker and producers may redeliver a message", retention, redeliveryWindow))
	}
	return errs
}

// CheckScope tells why scope cannot be stored as a record's consumer, or
// nil; the error completes a sentence starting with the field's name.
func CheckScope(scope string) error {
	switch {
	case scope == "":
		return errors.New("is empty")
	case len(scope) > repository.MaxConsumerLength:
		return fmt.Errorf("is %d bytes, longer than %d", len(scope), repository.MaxConsumerLength)
	case !utf8.ValidString(scope):
		return errors.New("is not valid UTF-8")
	case strings.IndexByte(scope, 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	return nil
}
