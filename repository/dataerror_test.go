package repository_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

// TestIsDataException provokes real errors on PostgreSQL and MariaDB and
// checks that exactly the refused values are data exceptions.
func TestIsDataException(t *testing.T) {
	for _, db := range []testDB{postgresDB, mysqlDB} {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel()
			table := repotest.RandomName("data_exc")
			exec := db.execer(t)
			charset := ""
			if db.name == "mysql" {
				charset = " CHARACTER SET utf8mb4"
			}
			require.NoError(t, exec(`CREATE TABLE `+table+` (
				id   VARCHAR(64) PRIMARY KEY,
				s    VARCHAR(4)`+charset+`,
				n    SMALLINT,
				ts   TIMESTAMP NULL,
				must VARCHAR(4) NOT NULL DEFAULT 'x'
			)`))
			t.Cleanup(func() { require.NoError(t, exec(`DROP TABLE IF EXISTS `+table)) })
			require.NoError(t, exec(`INSERT INTO `+table+` (id) VALUES (?)`, "a"))

			requireClassified(t, repository.IsDataException, []provoked{
				{"invalid UTF-8", exec(`INSERT INTO `+table+` (id, s) VALUES (?, ?)`, "b", "\xff\xfe"), true},
				{"too long", exec(`INSERT INTO `+table+` (id, s) VALUES (?, ?)`, "c", "toolong"), true},
				// Literals, so that the server judges them (pgx refuses some
				// parameters before they are sent).
				{"out of range", exec(`INSERT INTO ` + table + ` (id, n) VALUES ('d', 100000)`), true},
				{"not a number", exec(`INSERT INTO ` + table + ` (id, n) VALUES ('e', 'abc')`), true},
				{"not a time", exec(`INSERT INTO ` + table + ` (id, ts) VALUES ('f', 'not a time')`), true},
				{"primary key", exec(`INSERT INTO `+table+` (id) VALUES (?)`, "a"), false},
				{"not null", exec(`INSERT INTO `+table+` (id, must) VALUES (?, NULL)`, "g"), false},
				{"no such table", exec(`INSERT INTO nowhere_` + table + ` VALUES (1)`), false},
			})
			if db.name == "postgres" {
				err := exec(`INSERT INTO `+table+` (id, s) VALUES (?, ?)`, "h", "a\x00b")
				require.True(t, repository.IsDataException(err), "NUL in text: %v", err)
			}
		})
	}
}

// TestIsDataExceptionMySQLGenericState covers what MySQL (unlike MariaDB,
// which the tests run against) reports under SQLSTATE HY000.
func TestIsDataExceptionMySQLGenericState(t *testing.T) {
	hy := [5]byte{'H', 'Y', '0', '0', '0'}
	require.True(t, repository.IsDataException(&mysql.MySQLError{Number: 1366, SQLState: hy, Message: "Incorrect string value"}))
	require.True(t, repository.IsDataException(&mysql.MySQLError{Number: 1300, SQLState: hy, Message: "Invalid utf8mb4 character string"}))
	require.False(t, repository.IsDataException(&mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'}, Message: "Deadlock"}))
	require.False(t, repository.IsDataException(&mysql.MySQLError{Number: 1205, SQLState: hy, Message: "Lock wait timeout"}))
}

func TestIsDataExceptionOfNonDatabaseErrors(t *testing.T) {
	require.False(t, repository.IsDataException(nil))
	require.False(t, repository.IsDataException(errors.New("invalid byte sequence for encoding \"UTF8\": 0x00")),
		"message text is never trusted")
	require.False(t, repository.IsDataException(sql.ErrNoRows))
}
