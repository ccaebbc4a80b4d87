package repository

import (
	"context"
	"fmt"
	"time"
)

// ResolveAction is what an operator does with a stuck two-phase record.
type ResolveAction int

const (
	// ResolveComplete marks the record completed with ResolveParams.Result:
	// the operator checked the downstream system and the effect happened.
	// Later deliveries of the key are duplicates and replay that result.
	ResolveComplete ResolveAction = iota + 1
	// ResolveRelease deletes the record: the operator checked the
	// downstream system and the effect did not happen. The next delivery
	// of the key claims it afresh and runs the handler.
	ResolveRelease
)

func (a ResolveAction) String() string {
	switch a {
	case ResolveComplete:
		return "complete"
	case ResolveRelease:
		return "release"
	default:
		return fmt.Sprintf("ResolveAction(%d)", int(a))
	}
}

// DefaultListStuckLimit is the number of records ListStuck returns when
// ListStuckParams.Limit is zero.
const DefaultListStuckLimit = 100

// ListStuckParams are the arguments of [Operator.ListStuck].
type ListStuckParams struct {
	// Consumer restricts the listing to one consumer. Default: "" (every
	// consumer in the store).
	Consumer string
	// Now is the time leases are judged against; required. Pass the same
	// clock the consumers use.
	Now time.Time
	// Limit is the most records returned. Default: DefaultListStuckLimit
	// (100); it must not be negative.
	Limit int
}

// ResolveParams are the arguments of [Operator.Resolve].
type ResolveParams struct {
	// Consumer of the record; required.
	Consumer string
	// Key is the record's stored key exactly as [Operator.ListStuck] (or
	// Reader.Get) returns it in Record.Key — for keys longer than
	// MaxKeyLength that is the hashed form, see StorageKey. It is not
	// hashed again; pass StorageKey(k) to address an original key k.
	Key string
	// ExpectedOwner is the lease owner the operator saw (Record.LeaseOwner);
	// required. Resolve changes the record only while this owner still
	// holds it, so an operator never overwrites an attempt that reclaimed
	// the record in the meantime.
	ExpectedOwner string
	// Action is ResolveComplete or ResolveRelease; required.
	Action ResolveAction
	// Result is the stored result ResolveComplete keeps for duplicates to
	// replay: nil for no messages, or the messages encoded by
	// middleware.EncodeResult. Anything else (free text, other JSON) is
	// refused with ErrInvalidParams, because every later duplicate would
	// fail to replay it. Ignored by ResolveRelease.
	Result []byte
	// Now is the time the lease is judged against and, for
	// ResolveComplete, stored as CompletedAt; required.
	Now time.Time
}

// Operator is the optional capability for intervening on stuck two-phase
// records: records left in_progress by an attempt whose lease expired
// (it crashed, hung or lost its store mid-effect), typically routed to
// the poison queue by the Intervene policy. Find it by type assertion:
//
//	op, ok := repo.(repository.Operator)
//
// ListStuck returns at most Limit in_progress records whose lease expired
// at Now (LeaseUntil not after Now) and that have not expired themselves,
// oldest lease first. It is a read for an operator tool, not for the hot
// path: depending on the backend it scans the table or the key space
// (see each backend's documentation).
//
// Resolve marks one such record completed or releases it, in one atomic
// conditional write fenced by state, owner and lease: it succeeds only if
// the record is still in_progress, still leased by ExpectedOwner and the
// lease has expired at Now. It returns ErrNotFound when the record does not
// exist (or has expired), and ErrLeaseLost when it exists but no longer
// matches — another attempt reclaimed or completed it, it was resolved
// already, or its lease is live again (an attempt is running: wait for it).
// Of an operator's Resolve and a consumer's Reclaim racing on one record,
// exactly one succeeds.
type Operator interface {
	ListStuck(ctx context.Context, params ListStuckParams) ([]Record, error)
	Resolve(ctx context.Context, params ResolveParams) error
}
