package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

const (
	// MaxKeyLength is the longest key, in bytes, that backends store as is.
	// The SQL backends size their key column for it.
	MaxKeyLength = 255
	// MaxConsumerLength is the longest consumer name, in bytes.
	MaxConsumerLength = 255

	hashedKeyPrefix = "sha256:"
)

// StorageKey returns the form in which key is stored: the key itself when
// it fits in MaxKeyLength bytes, is valid UTF-8 and holds no NUL byte,
// otherwise "sha256:" followed by the hex SHA-256 of the key. Every
// backend stores the result as is — PostgreSQL text refuses NUL and
// invalid UTF-8, MySQL's utf8mb4 refuses invalid UTF-8 — so any key a
// KeyFunc can produce is stored, the same way on every backend. A key
// that itself starts with "sha256:" is always hashed, so a short key can
// never collide with the hashed form of another. Keys are never
// truncated: two long keys that share a prefix stay distinct. Version
// guard entities are stored the same way (see PrepareAdvance).
func StorageKey(key string) string {
	if len(key) <= MaxKeyLength && storable(key) && !strings.HasPrefix(key, hashedKeyPrefix) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hashedKeyPrefix + hex.EncodeToString(sum[:])
}

// HashPayload returns the SHA-256 of a message payload, the value stored as
// Record.PayloadHash and compared on duplicates.
func HashPayload(payload []byte) []byte {
	sum := sha256.Sum256(payload)
	return sum[:]
}

// ValidateClaim checks the fields every claim needs.
func ValidateClaim(p ClaimParams) error {
	if err := validateConsumerKey(p.Consumer, p.Key); err != nil {
		return err
	}
	return validateDeadline("ExpiresAt", p.ExpiresAt, p.Now)
}

// validateDeadline checks that Now is set and that the deadline in the
// named field is after it.
func validateDeadline(field string, deadline, now time.Time) error {
	if now.IsZero() {
		return fmt.Errorf("%w: Now is required", ErrInvalidParams)
	}
	if !deadline.After(now) {
		return fmt.Errorf("%w: %s (%s) must be after Now (%s)", ErrInvalidParams, field, deadline, now)
	}
	return nil
}

// storable reports whether every backend can store s as text: valid
// UTF-8 without NUL bytes.
func storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// ValidateConsumer checks a consumer name: non-empty, at most
// MaxConsumerLength bytes of valid UTF-8 without NUL bytes, so that every
// backend stores it as is (consumers are not hashed: operators read and
// filter by them). A refused name wraps ErrInvalidParams and says why;
// the inbox middleware treats it as permanent, since no retry can change
// it.
func ValidateConsumer(consumer string) error {
	switch {
	case consumer == "":
		return fmt.Errorf("%w: consumer is required", ErrInvalidParams)
	case len(consumer) > MaxConsumerLength:
		return fmt.Errorf("%w: consumer %.40q… is %d bytes, at most %d are allowed", ErrInvalidParams, consumer, len(consumer), MaxConsumerLength)
	case !utf8.ValidString(consumer):
		return fmt.Errorf("%w: consumer %q is not valid UTF-8", ErrInvalidParams, consumer)
	case strings.IndexByte(consumer, 0) >= 0:
		return fmt.Errorf("%w: consumer %q contains a NUL byte", ErrInvalidParams, consumer)
	}
	return nil
}

func validateConsumerKey(consumer, key string) error {
	if err := ValidateConsumer(consumer); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("%w: key is required", ErrInvalidParams)
	}
	return nil
}

// ValidateSaveResult checks the fields SaveResultTx needs.
func ValidateSaveResult(p SaveResultParams) error {
	return validateConsumerKey(p.Consumer, p.Key)
}

// ValidateGet checks the arguments of Reader.Get.
func ValidateGet(consumer, key string) error {
	return validateConsumerKey(consumer, key)
}
