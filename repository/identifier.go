package repository

import (
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

// IndexName derives an index name from a table name and a suffix, for DDL.
// The schema part, if any, is dropped (indexes live in the table's schema).
func IndexName(table, suffix string) string {
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		table = table[i+1:]
	}
	name := table + "_" + suffix
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}
