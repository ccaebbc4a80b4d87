package repository

import (
	"context"
)

// DefaultVersionsTableName is the version guard's table name used when
// none is configured.
const DefaultVersionsTableName = "watermill_versions"

// MaxEntityLength is the longest entity identifier, in bytes, that the
// version guard stores as is. Longer identifiers — and those with invalid
// UTF-8 or a NUL byte — are stored hashed like keys (see StorageKey),
// never truncated or refused.
const MaxEntityLength = MaxKeyLength

// AdvanceParams are the arguments of [VersionGuard.Advance].
type AdvanceParams struct {
	// Consumer scopes the entity, like the inbox's keys; required.
	Consumer string
	// Entity identifies what the version orders (an order id, an
	// aggregate id); required. Any bytes: entities that do not fit
	// MaxEntityLength bytes of UTF-8 without NUL are stored hashed, like
	// keys (StorageKey).
	Entity string
	// Version is the message's version of the entity. Any int64 except
	// math.MinInt64; larger is newer.
	Version int64
}

// VersionGuard is the storage contract of the version guard, for
// consumers that depend on order: it keeps, per (consumer, entity), the
// last applied version.
//
// Advance records Version as the last applied version of the entity,
// inside the caller's transaction, if and only if it is newer than the
// stored one (or none is stored). It returns applied true when it did, and
// applied false — storing nothing — when the stored version is equal or
// newer: the message is stale. It is one atomic conditional upsert,
// never a read followed by a write. The row stays locked until the
// caller's transaction ends, so concurrent transactions for the same
// entity queue behind it and then compare against what it committed
// (or, if it rolled back, against what was there before): the business
// writes that follow an applied Advance run in version order.
//
// TTx is the driver's transaction, as in [Driver]: postgres.NewVersionStore
// and the MySQL and SQLite version stores take a *sql.Tx,
// postgres.NewPgxVersionStore a pgx.Tx.
type VersionGuard[TTx any] interface {
	Advance(ctx context.Context, tx TTx, params AdvanceParams) (applied bool, err error)
}
