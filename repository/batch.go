package repository

import (
	"context"
)

// BatchTransactional is the optional capability behind the inbox's group
// commit (middleware.Config.Batch): many deliveries share one
// transaction, and their markers are claimed together. The SQL backends
// implement it; an Inbox in batch mode over a repository without it
// claims each marker with ClaimTx on the shared transaction instead.
//
// ClaimBatchTx claims every (consumer, key) of params in tx with as few
// statements as the database allows (one multi-row conditional insert on
// PostgreSQL and SQLite, one multi-row INSERT on MySQL unless a key is
// taken), and returns one Claim per param, in order, with the meaning of
// ClaimTx: Claimed, or the stored record of a duplicate. Keys are claimed
// in a fixed order (by consumer, then stored key), so two batches
// claiming overlapping keys wait for each other rather than deadlock. The
// (consumer, key) pairs of one call must be distinct: a pair given twice
// is refused with ErrInvalidParams. On error, tx must be rolled back.
//
// RetryableTx reports whether err, returned by any statement of a
// transaction or by its commit, means that the database gave up the
// transaction for a reason that running it again can cure: a deadlock
// victim, a serialization failure. A nil err is not retryable.
type BatchTransactional interface {
	Transactional
	ClaimBatchTx(ctx context.Context, tx Querier, params []ClaimParams) ([]Claim, error)
	RetryableTx(err error) bool
}
