package repository

import "context"

// Driver is the one seam between the library and a SQL database reached
// through one Go driver, generic over the driver's transaction type TTx:
// *sql.Tx for database/sql, pgx.Tx for pgx/v5. The transactional inbox
// (middleware.NewInbox, every mode and group commit), once.NewTransactional
// and the version guard take a Driver, and run the claim, the caller's
// writes and the stored result in one TTx; a handler reads that TTx with
// idempotency.Tx.
//
// The SQL backends return one: postgres.NewRepository (database/sql) and
// postgres.NewPgxRepository (pgx), mysql.NewRepository and
// sqlite.NewRepository; every one of them reaches the claim through the
// same statement of its dialect. Driver is the library's contract with
// those backends, as River's riverdriver.Driver is: do not implement it
// outside this module, methods may be added in minor releases.
//
// Claim inserts the (consumer, key) marker of each param with one atomic
// conditional insert in tx. A concurrent claim of the same key in another
// transaction blocks until that transaction ends, then returns the
// committed record as a duplicate, or claims the key if the first
// transaction rolled back. claims[k] answers params[k]: Claimed, or the
// stored record of a duplicate in Existing. Several params are claimed
// in a fixed order (by consumer, then stored key), so two transactions
// claiming overlapping keys wait for each other rather than deadlock;
// a (consumer, key) given twice is refused with ErrInvalidParams. On an
// error tx must be rolled back.
//
// BeginClaim begins a transaction and claims params in it, in the round
// trip of BEGIN where the driver can send both at once (pgx); the
// transaction is open whatever the claims say. On an error it has ended.
//
// SaveResult stores the handler's encoded result on a record claimed in
// the same transaction; ErrNotFound if there is no such record.
//
// Commit and Rollback end tx; Rollback of a transaction that has ended,
// or of the zero TTx, returns nil.
//
// Retryable reports whether err, returned by any statement of a
// transaction or by its commit, means the database gave the transaction
// up for a reason running it again can cure: a deadlock victim, a
// serialization failure. A nil err is not retryable.
//
// Reserve takes one connection of the driver's pool ahead of the
// transactions begun on it (group commit fills a batch while the pool has
// none free): it returns a Driver whose transactions begin, one at a
// time, on that connection, and release, which gives the connection back
// once the last of them has ended.
type Driver[TTx any] interface {
	Reader
	Begin(ctx context.Context) (TTx, error)
	BeginClaim(ctx context.Context, params []ClaimParams) (tx TTx, claims []Claim, err error)
	Claim(ctx context.Context, tx TTx, params []ClaimParams) ([]Claim, error)
	SaveResult(ctx context.Context, tx TTx, params SaveResultParams) error
	Commit(ctx context.Context, tx TTx) error
	Rollback(ctx context.Context, tx TTx) error
	Retryable(err error) bool
	Reserve(ctx context.Context) (_ Driver[TTx], release func(), _ error)
}
