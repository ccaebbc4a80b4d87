package middleware

import "time"

// FinishRetry bounds the retries of a two-phase delivery's last store
// write — Complete after the handler succeeded, Release after it failed;
// once.Config and httpidem.Config use it the same way. Tried once, one
// transient store error after a successful effect would leave the key in
// progress: the redelivery then finds the lease expired and re-runs the
// effect (Reclaim) or sends an applied message to the poison queue
// (Intervene). Between attempts the lease is extended, so no
// other delivery takes the key over meanwhile; every attempt is fenced by
// the owner, so a retry after the lease was lost stops with
// repository.ErrLeaseLost and never overwrites the newer owner.
//
// With the defaults a delivery retries for about 11 s (waits of 0.1, 0.2,
// 0.4, 0.8 and 1.6 s, then 2 s four times) plus the attempts themselves,
// each bounded by TwoPhaseConfig.StoreTimeout: long enough to ride out a
// connection pool reconnecting after its connections were cut, or a
// database failing over, and well inside the default 30 s lease. The
// delivery waits for the first 2 × StoreTimeout of them (at least one
// attempt); the rest go on in the background (TwoPhaseInbox.Drain).
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
