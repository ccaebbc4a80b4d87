// Package sqlstate reads the SQLSTATE code of a database error, the one
// way every package of the module recognises PostgreSQL errors:
//
//	if sqlstate.Of(err) == "40P01" { // deadlock_detected
//		// run the transaction again
//	}
package sqlstate

import "errors"

// Of returns the SQLSTATE of the first error in err's chain with a
// SQLState() string method (pgx's *pgconn.PgError, lib/pq's *pq.Error),
// or "" when there is none.
func Of(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}
