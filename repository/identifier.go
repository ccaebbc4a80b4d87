package repository

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// DefaultTableName is the inbox table name used when none is configured.
const DefaultTableName = "watermill_inbox"

var identifierRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ValidateTableName accepts a plain SQL identifier of at most 63 characters
// (letters, digits, underscores, not starting with a digit), optionally
// qualified by a schema as "schema.table". Anything else — quotes, spaces,
// semicolons, comments — is refused with ErrInvalidTableName, so table
// names can never carry SQL into a statement.
func ValidateTableName(name string) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return fmt.Errorf("%w: %q has more than one '.'", ErrInvalidTableName, name)
	}
	for _, p := range parts {
		if !identifierRe.MatchString(p) {
			return fmt.Errorf("%w: %q must match %s (optionally schema-qualified)", ErrInvalidTableName, name, identifierRe)
		}
	}
	return nil
}

// QuoteTableName validates name and quotes each of its parts with quote
// (`"` for PostgreSQL and SQLite, "`" for MySQL).
func QuoteTableName(name, quote string) (string, error) {
	if err := ValidateTableName(name); err != nil {
		return "", err
	}
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = quote + p + quote
	}
	return strings.Join(parts, "."), nil
}

// maxIdentifierLength is the longest identifier every supported database
// keeps whole: PostgreSQL truncates longer ones to 63 bytes, MySQL refuses
// more than 64 characters, SQLite has no limit.
const maxIdentifierLength = 63

// IndexName derives the name of an object that belongs to a table — an
// index, a trigger, a function — from the table's name and a suffix
// naming the object ("expires_at_idx"), for DDL. The schema part of table,
// if any, is dropped (the object lives in the table's schema). Every
// backend derives its names here, so the rule holds on each:
//
//   - when table + "_" + suffix fits in 63 bytes, it is the name: longer
//     than the table, so never equal to it;
//   - otherwise the name is a prefix of the table, "_", 8 hex digits of
//     the SHA-256 of table + "_" + suffix, "_" and the suffix, 63 bytes in
//     all: never truncated by PostgreSQL, never equal to the table (were
//     the table itself spelled that way, the separator before the hash
//     becomes "x"), and distinct for distinct tables and suffixes unless
//     their hashes collide.
//
// PostgreSQL and SQLite keep tables and indexes in one namespace, so an
// index named like its table would make CREATE INDEX IF NOT EXISTS skip
// it (PostgreSQL) or fail (SQLite). suffix is a short constant of the
// caller's; one longer than 32 bytes is cut to 32 in the hashed form.
func IndexName(table, suffix string) string {
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		table = table[i+1:]
	}
	name := table + "_" + suffix
	if len(name) <= maxIdentifierLength {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	hash := hex.EncodeToString(sum[:4])
	suffix = suffix[:min(len(suffix), 32)]
	keep := min(len(table), maxIdentifierLength-len(hash)-len(suffix)-2)
	derived := table[:keep] + "_" + hash + "_" + suffix
	if derived == table {
		derived = table[:keep] + "x" + hash + "_" + suffix
	}
	return derived
}
