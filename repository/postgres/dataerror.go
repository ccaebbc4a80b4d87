package postgres

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/watermill-idempotent/repository"
)

// init teaches repository.IsDataException the error PostgreSQL answers a
// statement whose text holds a NUL byte with, which only pgx's error type
// tells apart (see isUnreadableStatement).
func init() { repository.RegisterDataException(isUnreadableStatement) }

// sqlStateProtocolViolation is SQLSTATE 08P01, protocol_violation.
const sqlStateProtocolViolation = "08P01"

// isUnreadableStatement reports whether err, or any error it wraps, is
// PostgreSQL refusing to read a statement whose text holds a NUL byte:
// SQLSTATE 08P01 at severity ERROR, raised in the server's reader of
// protocol messages, source file pqformat.c.
//
// The protocol carries a statement's text as a NUL-terminated string. In
// pgx's simple protocol (default_query_exec_mode=simple_protocol, which
// PgBouncer's transaction pooling needs) the arguments are quoted into
// that text, so a NUL byte in a text argument ends the string early and
// the server finds bytes left over in the message ("invalid message
// format", routine pq_getmsgend); a NUL byte in the SQL itself does the
// same in every mode. The extended protocol sends an argument apart and
// the server refuses it as data, 22021, which IsDataException knows by
// its class. Either way the same statement with the same values fails the
// same way on every retry.
//
// The code alone does not say so: PgBouncer uses 08P01 for its own
// errors, most of them transient ("server conn crashed?", "no more
// connections allowed", "result prepare failed"), and sends them with a
// severity, a code and a message only — never a source file, which is
// PostgreSQL's own diagnostic field (F in the ErrorResponse). A FATAL
// 08P01 (a malformed startup packet) ends the session, not a statement,
// and is left to the retry on a new connection. Recognised by these
// fields, never by message text.
func isUnreadableStatement(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == sqlStateProtocolViolation &&
		pg.SeverityUnlocalized == "ERROR" && pg.File == "pqformat.c"
}
