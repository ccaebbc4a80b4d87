package repository

import (
	"context"
	"time"
)

// State is the lifecycle state of an inbox record.
type State string

const (
	// StateInProgress marks a claim whose effects have not completed yet.
	// The transactional mode never exposes it to other transactions: its
	// marker is written and completed inside one transaction.
	StateInProgress State = "in_progress"
	// StateCompleted marks a delivery whose effects are committed. A later
	// delivery with the same (consumer, key) is a duplicate.
	StateCompleted State = "completed"
)

// Record is what a backend stores for one (consumer, key).
type Record struct {
	// Consumer is the consumer identity that scopes the key.
	Consumer string
	// Key is the stored deduplication key: the key itself, or its hashed
	// form (see [StorageKey]) when it is longer than [MaxKeyLength].
	Key string
	// State is the record's lifecycle state.
	State State
	// PayloadHash is the hash of the payload of the delivery that claimed
	// the key (see [HashPayload]); duplicates are compared against it.
	PayloadHash []byte
	// Result is the opaque encoded result of the handler (the messages it
	// produced), stored so that duplicates can replay it. Nil when the
	// handler produced nothing.
	Result []byte
	// Attempts counts the claims made on this record.
	Attempts int
	// LeaseOwner and LeaseUntil describe the two-phase lease; empty and zero
	// in transactional mode.
	LeaseOwner string
	LeaseUntil time.Time
	// CreatedAt is when the key was first claimed.
	CreatedAt time.Time
	// CompletedAt is when the record reached StateCompleted; zero before.
	CompletedAt time.Time
	// ExpiresAt is when the record may be deleted by cleanup.
	ExpiresAt time.Time
}

// ClaimParams are the arguments of [Driver]'s Claim and BeginClaim.
type ClaimParams struct {
	// Consumer scopes the key; required.
	Consumer string
	// Key is the deduplication key; required. Keys longer than
	// MaxKeyLength are stored hashed (see StorageKey), never truncated.
	Key string
	// PayloadHash identifies the content of the delivery.
	PayloadHash []byte
	// Now is the claim time, stored as CreatedAt (and CompletedAt: a
	// transactional claim is only ever visible once committed).
	Now time.Time
	// ExpiresAt is when the record may be deleted by cleanup; it must be
	// after Now.
	ExpiresAt time.Time
}

// Claim is the outcome of a claim.
type Claim struct {
	// Claimed is true when this call inserted the record: the caller owns
	// the key and must run the handler.
	Claimed bool
	// Existing is the record that was already stored when Claimed is
	// false (a duplicate). It is the zero Record when Claimed is true.
	Existing Record
}

// SaveResultParams are the arguments of [Driver]'s SaveResult.
type SaveResultParams struct {
	Consumer string
	Key      string
	// Result is the encoded handler result to replay to duplicates.
	Result []byte
}

// Reader reads a stored record. Backends implement it for operators and
// tests; it returns ErrNotFound when no record exists.
type Reader interface {
	Get(ctx context.Context, consumer, key string) (Record, error)
}

// Cleaner deletes expired records. DeleteExpired deletes at most limit
// records whose ExpiresAt is before the given time and returns how many it
// deleted. It deletes by primary key in one short statement, skipping rows
// that concurrent claims hold locked, so cleanup never blocks claims for
// long. Call it in a loop (see [DeleteAllExpired]) to drain a backlog.
type Cleaner interface {
	DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error)
}

// DeleteAllExpired calls c.DeleteExpired with batches of batchSize until a
// batch deletes fewer than batchSize records or ctx is done. It returns the
// total number of records deleted.
func DeleteAllExpired(ctx context.Context, c Cleaner, before time.Time, batchSize int) (int, error) {
	if batchSize <= 0 {
		return 0, errBatchSize
	}
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := c.DeleteExpired(ctx, before, batchSize)
		total += n
		if err != nil {
			return total, err
		}
		if n < batchSize {
			return total, nil
		}
	}
}
