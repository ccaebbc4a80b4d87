// Package storekit is the kit the backends share: the validation of
// every store operation's arguments, so that each backend refuses the same
// input with the same repository.ErrInvalidParams, and the helpers of the
// operator calls and the version guard.
package storekit

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/watermill-idempotent/internal/resultcodec"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// ValidateClaim checks the fields every claim needs.
func ValidateClaim(p repository.ClaimParams) error {
	if err := validateConsumerKey(p.Consumer, p.Key); err != nil {
		return err
	}
	return validateDeadline("ExpiresAt", p.ExpiresAt, p.Now)
}

// validateDeadline checks that Now is set and that the deadline in the
// named field is after it.
func validateDeadline(field string, deadline, now time.Time) error {
	if now.IsZero() {
		return fmt.Errorf("%w: Now is required", repository.ErrInvalidParams)
	}
	if !deadline.After(now) {
		return fmt.Errorf("%w: %s (%s) must be after Now (%s)", repository.ErrInvalidParams, field, deadline, now)
	}
	return nil
}

// ValidateConsumer checks a consumer name: non-empty, at most
// repository.MaxConsumerLength bytes of valid UTF-8 without NUL bytes, so that every
// backend stores it as is (consumers are not hashed: operators read and
// filter by them). A refused name wraps repository.ErrInvalidParams and says why;
// the inbox middleware treats it as permanent, since no retry can change
// it.
func ValidateConsumer(consumer string) error {
	switch {
	case consumer == "":
		return fmt.Errorf("%w: consumer is required", repository.ErrInvalidParams)
	case len(consumer) > repository.MaxConsumerLength:
		return fmt.Errorf("%w: consumer %.40q… is %d bytes, at most %d are allowed", repository.ErrInvalidParams, consumer, len(consumer), repository.MaxConsumerLength)
	case !utf8.ValidString(consumer):
		return fmt.Errorf("%w: consumer %q is not valid UTF-8", repository.ErrInvalidParams, consumer)
	case strings.IndexByte(consumer, 0) >= 0:
		return fmt.Errorf("%w: consumer %q contains a NUL byte", repository.ErrInvalidParams, consumer)
	}
	return nil
}

func validateConsumerKey(consumer, key string) error {
	if err := ValidateConsumer(consumer); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("%w: key is required", repository.ErrInvalidParams)
	}
	return nil
}

// ValidateSaveResult checks the fields SaveResult needs.
func ValidateSaveResult(p repository.SaveResultParams) error {
	return validateConsumerKey(p.Consumer, p.Key)
}

// ValidateGet checks the arguments of repository.Reader.Get.
func ValidateGet(consumer, key string) error {
	return validateConsumerKey(consumer, key)
}

// ValidateAcquire checks the arguments of [repository.TwoPhase.Acquire]: consumer,
// key and owner are set, Now is set, and Now < LeaseUntil < ExpiresAt.
// Every backend calls it first, so they all refuse the same inputs with
// repository.ErrInvalidParams.
func ValidateAcquire(p repository.AcquireParams) error {
	if err := validateOwnedAt(p.Consumer, p.Key, p.Owner, p.Now); err != nil {
		return err
	}
	if err := validateDeadline("LeaseUntil", p.LeaseUntil, p.Now); err != nil {
		return err
	}
	if !p.ExpiresAt.After(p.LeaseUntil) {
		return fmt.Errorf("%w: ExpiresAt (%s) must be after LeaseUntil (%s)", repository.ErrInvalidParams, p.ExpiresAt, p.LeaseUntil)
	}
	return nil
}

// ValidateReclaim checks the arguments of [repository.TwoPhase.Reclaim]: consumer,
// key, the previous and the new owner are set and differ (an owner names
// one attempt), Now is set and LeaseUntil is after it.
func ValidateReclaim(p repository.ReclaimParams) error {
	if err := validateConsumerKey(p.Consumer, p.Key); err != nil {
		return err
	}
	if err := validateOwner("PrevOwner", p.PrevOwner); err != nil {
		return err
	}
	if err := validateOwner("Owner", p.Owner); err != nil {
		return err
	}
	if p.Owner == p.PrevOwner {
		return fmt.Errorf("%w: Owner must differ from PrevOwner (an owner identifies one attempt)", repository.ErrInvalidParams)
	}
	return validateDeadline("LeaseUntil", p.LeaseUntil, p.Now)
}

// ValidateExtend checks the arguments of [repository.TwoPhase.Extend]: consumer, key
// and owner are set and so is the new LeaseUntil.
func ValidateExtend(p repository.LeaseParams) error {
	if err := ValidateRelease(p); err != nil {
		return err
	}
	if p.LeaseUntil.IsZero() {
		return fmt.Errorf("%w: LeaseUntil is required", repository.ErrInvalidParams)
	}
	return nil
}

// ValidateRelease checks the arguments of [repository.TwoPhase.Release]: consumer,
// key and owner are set.
func ValidateRelease(p repository.LeaseParams) error {
	if err := validateConsumerKey(p.Consumer, p.Key); err != nil {
		return err
	}
	return validateOwner("Owner", p.Owner)
}

// ValidateComplete checks the arguments of [repository.TwoPhase.Complete]: consumer,
// key and owner are set and so is Now.
func ValidateComplete(p repository.CompleteParams) error {
	return validateOwnedAt(p.Consumer, p.Key, p.Owner, p.Now)
}

// validateOwnedAt checks what Acquire and Complete share: consumer, key,
// owner and Now are set.
func validateOwnedAt(consumer, key, owner string, now time.Time) error {
	if err := ValidateRelease(repository.LeaseParams{Consumer: consumer, Key: key, Owner: owner}); err != nil {
		return err
	}
	if now.IsZero() {
		return fmt.Errorf("%w: Now is required", repository.ErrInvalidParams)
	}
	return nil
}

func validateOwner(field, owner string) error {
	if owner == "" {
		return fmt.Errorf("%w: %s is required", repository.ErrInvalidParams, field)
	}
	if len(owner) > repository.MaxOwnerLength || !storable(owner) {
		return fmt.Errorf("%w: %s must be valid UTF-8 without NUL of at most %d bytes", repository.ErrInvalidParams, field, repository.MaxOwnerLength)
	}
	return nil
}

// ValidateListStuck checks the arguments of [repository.Operator.ListStuck] and
// returns them with defaults applied.
func ValidateListStuck(p repository.ListStuckParams) (repository.ListStuckParams, error) {
	if p.Consumer != "" {
		if err := ValidateConsumer(p.Consumer); err != nil {
			return p, err
		}
	}
	if p.Now.IsZero() {
		return p, fmt.Errorf("%w: Now is required", repository.ErrInvalidParams)
	}
	if p.Limit < 0 {
		return p, fmt.Errorf("%w: Limit must not be negative, got %d", repository.ErrInvalidParams, p.Limit)
	}
	if p.Limit == 0 {
		p.Limit = repository.DefaultListStuckLimit
	}
	return p, nil
}

// OrderStuck sorts records in ListStuck's order (oldest lease first, then
// consumer and key, byte-wise) and cuts them to limit; backends that
// cannot sort in a query use it.
func OrderStuck(recs []repository.Record, limit int) []repository.Record {
	slices.SortFunc(recs, func(a, b repository.Record) int {
		return cmp.Or(a.LeaseUntil.Compare(b.LeaseUntil), strings.Compare(a.Consumer, b.Consumer), strings.Compare(a.Key, b.Key))
	})
	return recs[:min(len(recs), limit)]
}

// ValidateResolve checks the arguments of [repository.Operator.Resolve]: consumer,
// stored key and expected owner are set, the key is a stored key (at most
// repository.MaxKeyLength bytes of UTF-8 without NUL), the action is known, Now is
// set and, for repository.ResolveComplete, Result is a stored result (see
// ValidateResult).
func ValidateResolve(p repository.ResolveParams) error {
	if err := validateConsumerKey(p.Consumer, p.Key); err != nil {
		return err
	}
	if len(p.Key) > repository.MaxKeyLength || !storable(p.Key) {
		return fmt.Errorf("%w: Key must be a stored key (repository.Record.Key, see repository.StorageKey) of at most %d bytes", repository.ErrInvalidParams, repository.MaxKeyLength)
	}
	if err := validateOwner("ExpectedOwner", p.ExpectedOwner); err != nil {
		return err
	}
	if p.Action != repository.ResolveComplete && p.Action != repository.ResolveRelease {
		return fmt.Errorf("%w: unknown action %s", repository.ErrInvalidParams, p.Action)
	}
	if p.Now.IsZero() {
		return fmt.Errorf("%w: Now is required", repository.ErrInvalidParams)
	}
	if p.Action == repository.ResolveComplete {
		if err := ValidateResult(p.Result); err != nil {
			return err
		}
	}
	return nil
}

// ValidateResult reports whether b is a stored result the inbox can
// replay: nil or empty (no messages), or the output of
// middleware.EncodeResult (any format version the inbox has written). It
// returns an error wrapping repository.ErrInvalidParams otherwise. The format belongs
// to the middleware; it lives in a package both import, so the repository
// can check it without importing the middleware.
func ValidateResult(b []byte) error {
	if err := resultcodec.Validate(b); err != nil {
		return fmt.Errorf("%w: Result is not a stored result (build it with middleware.EncodeResult): %w", repository.ErrInvalidParams, err)
	}
	return nil
}

// ValidateCountRecords checks the argument of [repository.Stats.CountRecords].
func ValidateCountRecords(now time.Time) error {
	if now.IsZero() {
		return fmt.Errorf("%w: now is required", repository.ErrInvalidParams)
	}
	return nil
}

// PrepareAdvance checks the arguments of [repository.VersionGuard]'s Advance and
// returns them as the backend stores them: Entity in its stored form,
// repository.StorageKey(Entity), so an entity of any length or content is stored the
// same way on every backend. Every backend's Advance calls it, and
// reads by entity (LastVersion) look up repository.StorageKey(entity). A refused
// argument wraps repository.ErrInvalidParams and names the problem.
func PrepareAdvance(p repository.AdvanceParams) (repository.AdvanceParams, error) {
	if err := ValidateConsumer(p.Consumer); err != nil {
		return p, err
	}
	if p.Entity == "" {
		return p, fmt.Errorf("%w: entity is required", repository.ErrInvalidParams)
	}
	if p.Version == math.MinInt64 {
		return p, fmt.Errorf("%w: version must be greater than math.MinInt64", repository.ErrInvalidParams)
	}
	p.Entity = repository.StorageKey(p.Entity)
	return p, nil
}

// IsSerializationFailure reports whether err, or any error it wraps,
// carries SQLSTATE 40001 (serialization_failure) or 40P01
// (deadlock_detected, PostgreSQL), from any error with a SQLState()
// string method: the whole transaction was rolled back and may run again.
func IsSerializationFailure(err error) bool {
	state := sqldialect.SQLState(err)
	return state == "40001" || state == "40P01"
}

// storable reports whether every backend can store s as text: valid
// UTF-8 without NUL bytes.
func storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}
