// Package sqlstate reads the SQLSTATE code of a database error, the one
// way every package of the module recognises PostgreSQL errors:
//
//	if sqlstate.Of(err) == "40P01" { // deadlock_detected
//		// run the transaction again
//	}
package sqlstate

import "github.com/idemkit/watermill-idempotent/sqldialect"

// Of returns the SQLSTATE of the first error in err's chain with a
// SQLState() string method (pgx's *pgconn.PgError, lib/pq's *pq.Error),
// or "" when there is none; it is sqldialect.SQLState.
func Of(err error) string { return sqldialect.SQLState(err) }
