package repository

import (
	"context"
	"fmt"
	"math"
	"unicode/utf8"
)

// DefaultVersionsTableName is the version guard's table name used when
// none is configured.
const DefaultVersionsTableName = "watermill_versions"

// MaxEntityLength is the longest entity identifier, in bytes, that the
// version guard stores. Longer identifiers are refused, not truncated.
const MaxEntityLength = 255

// AdvanceParams are the arguments of [VersionGuard.AdvanceTx].
type AdvanceParams struct {
	// Consumer scopes the entity, like the inbox's keys; required.
	Consumer string
	// Entity identifies what the version orders (an order id, an
	// aggregate id); required, at most MaxEntityLength bytes.
	Entity string
	// Version is the message's version of the entity. Any int64 except
	// math.MinInt64; larger is newer.
	Version int64
}

// VersionGuard is the storage contract of the version guard, for
// consumers that depend on order: it keeps, per (consumer, entity), the
// last applied version.
//
// AdvanceTx records Version as the last applied version of the entity,
// inside the caller's transaction, if and only if it is newer than the
// stored one (or none is stored). It returns applied true when it did, and
// applied false — storing nothing — when the stored version is equal or
// newer: the message is stale. It is one atomic conditional upsert,
// never a read followed by a write. The row stays locked until the
// caller's transaction ends, so concurrent transactions for the same
// entity queue behind it and then compare against what it committed
// (or, if it rolled back, against what was there before): the business
// writes that follow an applied AdvanceTx run in version order.
type VersionGuard interface {
	AdvanceTx(ctx context.Context, tx Querier, params AdvanceParams) (applied bool, err error)
}

// ValidateAdvance checks the arguments of [VersionGuard.AdvanceTx].
func ValidateAdvance(p AdvanceParams) error {
	if p.Consumer == "" {
		return fmt.Errorf("%w: consumer is required", ErrInvalidParams)
	}
	if len(p.Consumer) > MaxConsumerLength || !utf8.ValidString(p.Consumer) {
		return fmt.Errorf("%w: consumer must be valid UTF-8 of at most %d bytes", ErrInvalidParams, MaxConsumerLength)
	}
	if p.Entity == "" {
		return fmt.Errorf("%w: entity is required", ErrInvalidParams)
	}
	if len(p.Entity) > MaxEntityLength || !utf8.ValidString(p.Entity) {
		return fmt.Errorf("%w: entity must be valid UTF-8 of at most %d bytes", ErrInvalidParams, MaxEntityLength)
	}
	if p.Version == math.MinInt64 {
		return fmt.Errorf("%w: version must be greater than math.MinInt64", ErrInvalidParams)
	}
	return nil
}
