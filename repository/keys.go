package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
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
// it fits in MaxKeyLength bytes and is valid UTF-8, otherwise "sha256:"
// followed by the hex SHA-256 of the key. A key that itself starts with
// "sha256:" is always hashed, so a short key can never collide with the
// hashed form of a long one. Keys are never truncated: two long keys that
// share a prefix stay distinct.
func StorageKey(key string) string {
	if len(key) <= MaxKeyLength && utf8.ValidString(key) && !strings.HasPrefix(key, hashedKeyPrefix) {
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
	if p.Now.IsZero() {
		return fmt.Errorf("%w: Now is required", ErrInvalidParams)
	}
	if !p.ExpiresAt.After(p.Now) {
		return fmt.Errorf("%w: ExpiresAt (%s) must be after Now (%s)", ErrInvalidParams, p.ExpiresAt, p.Now)
	}
	return nil
}

func validateConsumerKey(consumer, key string) error {
	if consumer == "" {
		return fmt.Errorf("%w: consumer is required", ErrInvalidParams)
	}
	if len(consumer) > MaxConsumerLength || !utf8.ValidString(consumer) {
		return fmt.Errorf("%w: consumer must be valid UTF-8 of at most %d bytes", ErrInvalidParams, MaxConsumerLength)
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
