package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

const (
	// MaxKeyLength is the longest key, in bytes, that backends store as is.
	// The SQL backends size their key column for it.
	MaxKeyLength = 255
	// MaxConsumerLength is the longest consumer name, in bytes.
	MaxConsumerLength = 255
	// MaxOwnerLength is the longest lease owner, in bytes. The SQL
	// backends size their lease_owner column for it.
	MaxOwnerLength = 255

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
// guard entities are stored the same way (the version guard hashes them the same way).
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

// storable reports whether every backend can store s as text: valid
// UTF-8 without NUL bytes.
func storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}
