package repository

import (
	"errors"
	"strings"

	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// sqlStateClassDataException is the SQLSTATE class (first two characters)
// of the SQL standard's "data exception": a value in the statement that
// the database cannot accept — PostgreSQL 22021 (a NUL byte or invalid
// UTF-8 in text), 22001 (string too long), 22003 (numeric out of range),
// 22P02 (invalid text representation), 22008 (datetime out of range),
// 22012 (division by zero).
const sqlStateClassDataException = "22"

// ErrDataException is wrapped, beside their own sentinel, by the module's
// errors for a value it refuses before sending because the database would
// refuse it as data: in the outbox, a message UUID with a NUL byte or
// invalid UTF-8 on PostgreSQL, a UUID or topic longer than its column.
// IsDataException reports it like the database's own refusal, so the
// inbox middleware treats it as permanent.
var ErrDataException = errors.New("value the database refuses as data")

var dataDetectors detectors

// RegisterDataException adds a detector that IsDataException consults
// after its built-in check, like RegisterUniqueViolation: importing
// repository/mysql registers MySQL/MariaDB data errors, importing
// repository/postgres the errors of PostgreSQL that need pgx's error type
// to be told apart. A detector must
// recognise errors by code, never by message text, and must be safe for
// concurrent use.
func RegisterDataException(detector func(error) bool) {
	dataDetectors.add(detector)
}

// IsDataException reports whether err, or any error it wraps, is the
// database refusing a value of the statement — the same statement with the
// same values fails the same way however often it is retried:
//
//   - PostgreSQL: SQLSTATE class 22 ("data exception"), from any error
//     with a SQLState() string method (pgx's *pgconn.PgError, lib/pq's
//     *pq.Error);
//   - PostgreSQL, once repository/postgres is imported: SQLSTATE 08P01
//     raised at severity ERROR by the server's protocol-message reader,
//     its answer to a NUL byte in a statement's text — what a NUL byte in
//     a text argument becomes in pgx's simple protocol
//     (default_query_exec_mode=simple_protocol), which quotes arguments
//     into the text; the other modes send it apart and get 22021. 08P01
//     alone is not enough: PgBouncer reports transient errors under it;
//   - MySQL/MariaDB: SQLSTATE class 22, and errors 1366 (incorrect string
//     or integer value) and 1300 (invalid character string), which MySQL
//     reports under the generic SQLSTATE HY000, once repository/mysql is
//     imported;
//   - ErrDataException: a value the module refused before sending it,
//     for the same reason.
//
// SQLite is not covered: its columns take any value the backends write
// (dynamic typing, no length limit short of SQLITE_MAX_LENGTH, 1 GB by
// default). Constraint violations (class 23), connection, lock and
// serialization errors are not data exceptions. A nil err is not one.
func IsDataException(err error) bool {
	return err != nil && (strings.HasPrefix(sqldialect.SQLState(err), sqlStateClassDataException) ||
		errors.Is(err, ErrDataException) || dataDetectors.match(err))
}
