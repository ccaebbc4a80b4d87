package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	_ "github.com/idemkit/watermill-idempotent/repository/postgres" // registers its data exceptions
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

// TestDataExceptionInEveryExecMode provokes real errors on PostgreSQL,
// through database/sql (the mode in the DSN) and pgxpool, in every pgx
// query exec mode, and checks that repository.IsDataException recognises
// exactly the refused values — a NUL byte too, which the server answers
// with 22021 in the extended protocol and with 08P01 in simple_protocol,
// where pgx quotes it into the statement's text.
func TestDataExceptionInEveryExecMode(t *testing.T) {
	table := repotest.RandomName("data_exc")
	setup := testenv.Postgres(t)
	_, err := setup.Exec(`CREATE TABLE ` + table + ` (id VARCHAR(64) PRIMARY KEY, s VARCHAR(4), j JSONB, must VARCHAR(4) NOT NULL DEFAULT 'x')`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := setup.Exec(`DROP TABLE IF EXISTS ` + table)
		require.NoError(t, err)
	})
	_, err = setup.Exec(`INSERT INTO `+table+` (id) VALUES ($1)`, "taken")
	require.NoError(t, err)

	for _, mode := range testenv.PgxExecModes {
		for _, driver := range []struct {
			name string
			open func(t *testing.T) func(query string, args ...any) error
		}{
			{"database-sql", func(t *testing.T) func(string, ...any) error {
				db := testenv.PostgresInMode(t, mode)
				return func(query string, args ...any) error { _, err := db.Exec(query, args...); return err }
			}},
			{"pgxpool", func(t *testing.T) func(string, ...any) error {
				pool := testenv.PgxPoolInMode(t, mode)
				return func(query string, args ...any) error {
					_, err := pool.Exec(context.Background(), query, args...)
					return err
				}
			}},
		} {
			t.Run(driver.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				exec := driver.open(t)
				insert := `INSERT INTO ` + table + ` (id, s) VALUES ($1, $2)`
				for _, c := range []struct {
					name string
					err  error
					want bool
				}{
					{"NUL byte", exec(insert, "a", "a\x00b"), true},
					{"NUL byte and invalid UTF-8", exec(insert, "b", "\x00\xff"), true},
					{"invalid UTF-8", exec(insert, "c", "\xff\xfe"), true},
					{"too long", exec(insert, "d", "toolong"), true},
					{`JSON "\u0000"`, exec(`INSERT INTO `+table+` (id, j) VALUES ($1, $2)`, "e", `{"k": "\u0000"}`), true},
					// A NUL byte in the SQL itself: pgx sends a statement
					// without arguments in the simple protocol in every
					// mode; with arguments, the extended modes prepare it.
					{"NUL byte in the SQL", exec(`INSERT INTO ` + table + ` (id, s) VALUES ('f', 'a` + "\x00" + `')`), true},
					{"NUL byte in the SQL, with arguments", exec(`INSERT INTO `+table+` (id, s) VALUES ($1, 'a`+"\x00"+`')`, "g"), true},
					{"primary key", exec(insert, "taken", "ok"), false},
					{"not null", exec(`INSERT INTO `+table+` (id, must) VALUES ($1, NULL)`, "h"), false},
					{"no such table", exec(`INSERT INTO nowhere_`+table+` VALUES ($1)`, "i"), false},
				} {
					require.Error(t, c.err, c.name)
					for _, err := range []error{c.err, fmt.Errorf("handler: %w", c.err), errors.Join(errors.New("other"), c.err)} {
						require.Equal(t, c.want, repository.IsDataException(err), "%s: %v", c.name, err)
					}
				}
			})
		}
	}
}

// TestProtocolViolationsOfPoolersAreNotDataExceptions: SQLSTATE 08P01
// alone is no data exception. PgBouncer sends its own errors under it,
// most of them transient, with only a severity, the code and a message
// (send_pooler_error in its src/proto.c); a FATAL one ends the session;
// PostgreSQL raises 08P01 outside its message reader too (a Bind whose
// parameters do not match the statement, which a pooler switching
// server connections between Parse and Bind can cause).
func TestProtocolViolationsOfPoolersAreNotDataExceptions(t *testing.T) {
	for _, err := range []*pgconn.PgError{
		{Severity: "FATAL", Code: "08P01", Message: "server conn crashed?"},
		{Severity: "FATAL", Code: "08P01", Message: "no more connections allowed (max_client_conn)"},
		{Severity: "ERROR", Code: "08P01", Message: "result prepare failed"},
		{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "08P01", Message: "invalid length of startup packet", File: "postmaster.c"},
		{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "08P01", Message: "invalid message format", File: "pqformat.c", Routine: "pq_getmsgend"},
		{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01", Message: "bind message supplies 1 parameters, but prepared statement \"\" requires 0", File: "postgres.c", Routine: "exec_bind_message"},
	} {
		require.False(t, repository.IsDataException(err), "%s %s: %s", err.Severity, err.Code, err.Message)
	}
	// The server's own answer to a NUL byte, as the test above gets it.
	nul := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "08P01", Message: "invalid message format", File: "pqformat.c", Routine: "pq_getmsgend"}
	require.True(t, repository.IsDataException(nul))
	require.False(t, repository.IsDataException(errors.New(strings.ToUpper(nul.Error()))), "message text is never trusted")
}
