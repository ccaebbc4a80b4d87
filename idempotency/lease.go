package idempotency

import (
	"time"

	"github.com/idemkit/watermill-idempotent/internal/lease"
	"github.com/idemkit/watermill-idempotent/repository"
)

// DefaultRetention is how long a processed key is remembered by default,
// by every entry point.
const DefaultRetention = 7 * 24 * time.Hour

// DefaultLease is the default lease of a two-phase claim: the two-phase
// inbox's, once.TwoPhase's and httpidem's.
const DefaultLease = lease.DefaultLease

// ExpiredLeasePolicy decides what a two-phase delivery does when it finds
// the key in progress under an expired lease: an earlier attempt started
// the effect and stopped answering (crashed, hung, partitioned), so the
// effect may have partly happened.
type ExpiredLeasePolicy = repository.ExpiredLeasePolicy

const (
	// Intervene fails the delivery with the permanent ErrNeedsIntervention
	// and keeps the record for an operator, who checks the downstream
	// system and then marks the record completed or releases it for a
	// retry. The default: the safe choice for effects that are not
	// idempotent downstream (a payment without an idempotency key).
	Intervene = repository.Intervene
	// Reclaim takes the record over (exactly one racing delivery wins) and
	// runs the handler again. Use it only when the effect is idempotent
	// downstream, e.g. an API called with the propagated key as its
	// Idempotency-Key.
	Reclaim = repository.Reclaim
)

// FinishRetry bounds the retries of a two-phase call's last store write —
// Complete after the effect succeeded, Release after it failed — in the
// two-phase inbox, once.TwoPhase and httpidem alike. Tried once, one
// transient store error after a successful effect would leave the key in
// progress: the redelivery then finds the lease expired and re-runs the
// effect (Reclaim) or sends an applied message to the poison queue
// (Intervene). Between attempts the lease is extended, so no other
// delivery takes the key over meanwhile; every attempt is fenced by the
// owner, so a retry after the lease was lost stops with
// repository.ErrLeaseLost and never overwrites the newer owner.
//
// With the defaults a call retries for about 11 s (waits of 0.1, 0.2,
// 0.4, 0.8 and 1.6 s, then 2 s four times) plus the attempts themselves,
// each bounded by the config's StoreTimeout: long enough to ride out a
// connection pool reconnecting after its connections were cut, or a
// database failing over, and well inside the default 30 s lease. The
// call waits for the first 2 × StoreTimeout of them (at least one
// attempt); the rest go on in the background (each entry point's Drain).
type FinishRetry struct {
	// MaxAttempts is the most calls, the first included; 1 turns retrying
	// off. Default: 10.
	MaxAttempts int
	// InitialInterval is the wait before the first retry; each later wait
	// doubles. Default: 100 ms.
	InitialInterval time.Duration
	// MaxInterval caps the wait between attempts. Default: 2 s.
	MaxInterval time.Duration
}
