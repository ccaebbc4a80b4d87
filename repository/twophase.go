package repository

import (
	"context"
	"time"
)

// AcquireParams are the arguments of [TwoPhase.Acquire].
type AcquireParams struct {
	// Consumer scopes the key; required.
	Consumer string
	// Key is the deduplication key; required (hashed like ClaimParams.Key).
	Key string
	// PayloadHash identifies the content of the delivery.
	PayloadHash []byte
	// Owner identifies this attempt; required and unique per attempt (a
	// random UUID), so it doubles as the fencing token.
	Owner string
	// Now is the claim time.
	Now time.Time
	// LeaseUntil is when the lease runs out unless extended; after Now.
	LeaseUntil time.Time
	// ExpiresAt is when the record may be deleted; after LeaseUntil.
	ExpiresAt time.Time
}

// Acquisition is the outcome of [TwoPhase.Acquire].
type Acquisition struct {
	// Acquired is true when this call created the in_progress record: the
	// caller holds the lease and must run the effect.
	Acquired bool
	// Existing is the stored record when Acquired is false: StateCompleted
	// (a duplicate), or StateInProgress held by another owner — with a live
	// lease (LeaseUntil after Now: busy, retry later) or an expired one
	// (stale: the earlier attempt may have partly happened).
	Existing Record
}

// ReclaimParams are the arguments of [TwoPhase.Reclaim].
type ReclaimParams struct {
	Consumer string
	Key      string
	// PrevOwner is the owner whose expired lease is taken over, as read
	// from Acquisition.Existing.LeaseOwner.
	PrevOwner string
	// Owner is the new attempt's owner.
	Owner      string
	Now        time.Time
	LeaseUntil time.Time
}

// LeaseParams identify a lease held by Owner, for Extend and Release.
type LeaseParams struct {
	Consumer string
	Key      string
	Owner    string
	// LeaseUntil is the new deadline (Extend only).
	LeaseUntil time.Time
}

// CompleteParams are the arguments of [TwoPhase.Complete].
type CompleteParams struct {
	Consumer string
	Key      string
	Owner    string
	// Result is the encoded handler result to replay to duplicates.
	Result []byte
	// Now is stored as CompletedAt.
	Now time.Time
}

// TwoPhase is the storage contract for effects that cannot join a SQL
// transaction: claim the key in progress under a lease, run the effect,
// then complete. Every state change is one atomic conditional write
// fenced by the owner, never a read followed by a write.
//
// Acquire creates the in_progress record if none exists (one atomic
// conditional insert); otherwise it returns the stored record.
//
// Reclaim takes over an in_progress record whose lease has expired at
// params.Now and is still held by params.PrevOwner, and increments its
// Attempts. Of several racing reclaims exactly one succeeds; the others
// get ErrLeaseLost.
//
// Extend moves the lease deadline, Complete stores the result and marks
// the record completed (keeping Owner as its LeaseOwner, so an attempt
// whose answer was lost after the commit can recognise its own
// completion), and Release deletes the in_progress record so a
// retry can claim it. Each succeeds only while the record is in_progress
// and owned by params.Owner — an attempt that lost its lease to a newer
// owner cannot extend, complete or release it — and returns ErrLeaseLost
// otherwise.
type TwoPhase interface {
	Acquire(ctx context.Context, params AcquireParams) (Acquisition, error)
	Reclaim(ctx context.Context, params ReclaimParams) (Record, error)
	Extend(ctx context.Context, params LeaseParams) error
	Complete(ctx context.Context, params CompleteParams) error
	Release(ctx context.Context, params LeaseParams) error
}
