package repository

import (
	"context"
	"time"
)

// RecordCount is how many live records one consumer has in each state at
// a point in time, as returned by [Stats.CountRecords].
type RecordCount struct {
	// Consumer the counts belong to.
	Consumer string
	// InProgress counts two-phase claims whose lease is live: LeaseUntil
	// is after the sample's time, an attempt is (or may be) running.
	InProgress int
	// Stale counts records in progress under a lease that expired at the
	// sample's time (LeaseUntil not after it): the attempt crashed, hung
	// or lost its store mid-effect, and the record waits for a
	// redelivery to reclaim it or for an operator (see [Operator]).
	Stale int
	// Completed counts completed records, from either mode: the
	// deduplication memory that retention keeps.
	Completed int
}

// Stats is the optional capability for sampling how many records a store
// holds, for gauges; the janitor samples it after each pass for a
// janitor.SampleObserver. Find it by type assertion:
//
//	st, ok := repo.(repository.Stats)
//
// CountRecords returns one RecordCount per consumer that has at least one
// record not expired at now (ExpiresAt after now), sorted by consumer.
// Records whose ExpiresAt is not after now are left out on every backend:
// Redis has deleted them by TTL, and elsewhere they only wait for the
// janitor. now judges leases and expiry; pass the consumers' clock. It
// returns ErrInvalidParams when now is zero.
//
// It reads the whole store — one aggregate query (a full table scan) on
// the SQL backends, a walk of the key space on Redis — so its cost grows
// with the number of records: fine once per janitor interval, not for the
// hot path. The counts are a consistent snapshot where the backend reads
// one (one SQL statement, the memory mutex), not on Redis.
type Stats interface {
	CountRecords(ctx context.Context, now time.Time) ([]RecordCount, error)
}
