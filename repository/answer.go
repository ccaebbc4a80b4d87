package repository

import (
	"errors"
	"fmt"
	"time"
)

// The answers to a duplicate that every entry point shares (package
// middleware exports them under the same names; once and httpidem return
// them).
var (
	// ErrPayloadMismatch: the key was completed for other input (the
	// producer reused a key for other content). Permanent.
	ErrPayloadMismatch = errors.New("deduplication key reused with a different payload")
	// ErrNeedsIntervention: an earlier two-phase attempt's lease expired
	// mid-effect under the Intervene policy. Permanent: an operator
	// decides (see Operator).
	ErrNeedsIntervention = errors.New("earlier attempt expired mid-effect: needs intervention")
	// ErrInProgress: another attempt holds the key under a live lease.
	// Transient: retry later.
	ErrInProgress = errors.New("deduplication key is in progress elsewhere")
)

// BusyError is the answer to a key held in progress by another call
// (package once exports it). It wraps ErrInProgress.
type BusyError struct {
	Scope, Key string
	// Owner is the attempt holding the key; empty when unknown.
	Owner string
	// LeaseUntil is when the other attempt's lease runs out unless it is
	// extended; zero when unknown.
	LeaseUntil time.Time
}

func (e *BusyError) Error() string {
	if e.LeaseUntil.IsZero() {
		return fmt.Sprintf("%v: scope %q, key %q", ErrInProgress, e.Scope, e.Key)
	}
	return fmt.Sprintf("%v: scope %q, key %q is leased by %s until %s", ErrInProgress, e.Scope, e.Key, e.Owner, e.LeaseUntil.Format(time.RFC3339Nano))
}

// Unwrap makes errors.Is(err, ErrInProgress) true.
func (e *BusyError) Unwrap() error { return ErrInProgress }

// ExpiredLeasePolicy decides what a two-phase call does with a key in
// progress under an expired lease: the earlier attempt may have partly
// happened (package middleware exports it, with its values).
type ExpiredLeasePolicy int

// The policies.
const (
	// Intervene answers ErrNeedsIntervention and keeps the record for an
	// operator (the default).
	Intervene ExpiredLeasePolicy = iota
	// Reclaim takes the key over and runs again: for effects that are
	// idempotent themselves.
	Reclaim
)

func (p ExpiredLeasePolicy) String() string {
	if names := [...]string{Intervene: "intervene", Reclaim: "reclaim"}; p >= 0 && int(p) < len(names) {
		return names[p]
	}
	return fmt.Sprintf("ExpiredLeasePolicy(%d)", int(p))
}
