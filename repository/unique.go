package repository

import (
	"errors"
	"sync"

	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// PostgreSQL SQLSTATE and SQLite extended result codes that mean a unique
// constraint rejected a row.
const (
	sqlStateUniqueViolation    = "23505" // unique_violation, also raised for primary keys
	sqliteConstraintPrimaryKey = 1555    // SQLITE_CONSTRAINT_PRIMARYKEY
	sqliteConstraintUnique     = 2067    // SQLITE_CONSTRAINT_UNIQUE
)

var uniqueDetectors detectors

// detectors is a list of error recognisers that driver packages extend
// from init, safe for concurrent use.
type detectors struct {
	mu  sync.RWMutex
	fns []func(error) bool
}

func (d *detectors) add(fn func(error) bool) {
	if fn == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fns = append(d.fns, fn)
}

// match reports whether any detector recognises err.
func (d *detectors) match(err error) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, detect := range d.fns {
		if detect(err) {
			return true
		}
	}
	return false
}

// RegisterUniqueViolation adds a detector that IsUniqueViolation consults
// after its built-in checks. Driver packages whose error types cannot be
// recognised through an interface call it from init: importing
// repository/mysql registers MySQL/MariaDB errors 1062, 1586 and 1022.
// A detector must recognise errors by code, never by message text, and
// must be safe for concurrent use. RegisterUniqueViolation is safe to
// call concurrently with IsUniqueViolation.
func RegisterUniqueViolation(detector func(error) bool) {
	uniqueDetectors.add(detector)
}

// IsUniqueViolation reports whether err, or any error it wraps, is a
// unique-constraint (or primary-key) violation reported by the database,
// recognised by error code, never by message text:
//
//   - PostgreSQL: SQLSTATE 23505, from any error with a SQLState() string
//     method (pgx's *pgconn.PgError, lib/pq's *pq.Error);
//   - SQLite: extended result codes SQLITE_CONSTRAINT_UNIQUE (2067) and
//     SQLITE_CONSTRAINT_PRIMARYKEY (1555), from any error with a
//     Code() int method (modernc.org/sqlite's *sqlite.Error);
//   - MySQL/MariaDB: errors 1062 (ER_DUP_ENTRY), 1586
//     (ER_DUP_ENTRY_WITH_KEY_NAME) and 1022 (ER_DUP_KEY), once
//     repository/mysql is imported (it registers its detector, see
//     RegisterUniqueViolation; a blank import is enough).
//
// Other constraint violations (NOT NULL, foreign key, check) are not
// unique violations. A nil err is not one either.
func IsUniqueViolation(err error) bool {
	if err == nil {
		return false
	}
	if sqldialect.SQLState(err) == sqlStateUniqueViolation {
		return true
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		if c := lite.Code(); c == sqliteConstraintUnique || c == sqliteConstraintPrimaryKey {
			return true
		}
	}
	return uniqueDetectors.match(err)
}
