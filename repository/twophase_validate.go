package repository

import (
	"fmt"
	"time"
)

// MaxOwnerLength is the longest lease owner, in bytes. The SQL backends
// size their lease_owner column for it.
const MaxOwnerLength = 255

// ValidateAcquire checks the arguments of [TwoPhase.Acquire]: consumer,
// key and owner are set, Now is set, and Now < LeaseUntil < ExpiresAt.
// Every backend calls it first, so they all refuse the same inputs with
// ErrInvalidParams.
func ValidateAcquire(p AcquireParams) error {
	if err := validateOwnedAt(p.Consumer, p.Key, p.Owner, p.Now); err != nil {
		return err
	}
	if err := validateDeadline("LeaseUntil", p.LeaseUntil, p.Now); err != nil {
		return err
	}
	if !p.ExpiresAt.After(p.LeaseUntil) {
		return fmt.Errorf("%w: ExpiresAt (%s) must be after LeaseUntil (%s)", ErrInvalidParams, p.ExpiresAt, p.LeaseUntil)
	}
	return nil
}

// ValidateReclaim checks the arguments of [TwoPhase.Reclaim]: consumer,
// key, the previous and the new owner are set and differ (an owner names
// one attempt), Now is set and LeaseUntil is after it.
func ValidateReclaim(p ReclaimParams) error {
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
		return fmt.Errorf("%w: Owner must differ from PrevOwner (an owner identifies one attempt)", ErrInvalidParams)
	}
	return validateDeadline("LeaseUntil", p.LeaseUntil, p.Now)
}

// ValidateExtend checks the arguments of [TwoPhase.Extend]: consumer, key
// and owner are set and so is the new LeaseUntil.
func ValidateExtend(p LeaseParams) error {
	if err := ValidateRelease(p); err != nil {
		return err
	}
	if p.LeaseUntil.IsZero() {
		return fmt.Errorf("%w: LeaseUntil is required", ErrInvalidParams)
	}
	return nil
}

// ValidateRelease checks the arguments of [TwoPhase.Release]: consumer,
// key and owner are set.
func ValidateRelease(p LeaseParams) error {
	if err := validateConsumerKey(p.Consumer, p.Key); err != nil {
		return err
	}
	return validateOwner("Owner", p.Owner)
}

// ValidateComplete checks the arguments of [TwoPhase.Complete]: consumer,
// key and owner are set and so is Now.
func ValidateComplete(p CompleteParams) error {
	return validateOwnedAt(p.Consumer, p.Key, p.Owner, p.Now)
}

// validateOwnedAt checks what Acquire and Complete share: consumer, key,
// owner and Now are set.
func validateOwnedAt(consumer, key, owner string, now time.Time) error {
	if err := ValidateRelease(LeaseParams{Consumer: consumer, Key: key, Owner: owner}); err != nil {
		return err
	}
	if now.IsZero() {
		return fmt.Errorf("%w: Now is required", ErrInvalidParams)
	}
	return nil
}

func validateOwner(field, owner string) error {
	if owner == "" {
		return fmt.Errorf("%w: %s is required", ErrInvalidParams, field)
	}
	if len(owner) > MaxOwnerLength || !storable(owner) {
		return fmt.Errorf("%w: %s must be valid UTF-8 without NUL of at most %d bytes", ErrInvalidParams, field, MaxOwnerLength)
	}
	return nil
}
