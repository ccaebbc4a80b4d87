package repository_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/repository"
	_ "github.com/idemkit/watermill-idempotent/repository/mysql" // registers MySQL's unique-violation numbers
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

// TestIsUniqueViolation provokes real constraint violations on each
// database and checks that only unique and primary-key violations are
// recognised.
func TestIsUniqueViolation(t *testing.T) {
	for _, db := range []testDB{postgresDB, mysqlDB, sqliteDB} {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel()
			parent, child := repotest.RandomName("uniq_parent"), repotest.RandomName("uniq_child")
			exec := db.execer(t)
			require.NoError(t, exec(`CREATE TABLE `+parent+` (id VARCHAR(64) PRIMARY KEY)`))
			t.Cleanup(func() { require.NoError(t, exec(`DROP TABLE IF EXISTS `+parent)) })
			require.NoError(t, exec(`CREATE TABLE `+child+` (
				id        VARCHAR(64) PRIMARY KEY,
				email     VARCHAR(64) NOT NULL UNIQUE,
				parent_id VARCHAR(64) REFERENCES `+parent+` (id),
				CHECK (email <> 'forbidden')
			)`))
			t.Cleanup(func() { require.NoError(t, exec(`DROP TABLE IF EXISTS `+child)) })
			require.NoError(t, exec(`INSERT INTO `+parent+` (id) VALUES (?)`, "p1"))
			require.NoError(t, exec(`INSERT INTO `+child+` (id, email, parent_id) VALUES (?, ?, ?)`, "c1", "a@example.com", "p1"))

			// Setting a row's email to its own value is no violation.
			require.NoError(t, exec(`UPDATE `+child+` SET email = ? WHERE id = ?`, "a@example.com", "c1"), "no-op update")
			requireClassified(t, repository.IsUniqueViolation, []provoked{
				{"primary key", exec(`INSERT INTO `+child+` (id, email) VALUES (?, ?)`, "c1", "b@example.com"), true},
				{"unique column", exec(`INSERT INTO `+child+` (id, email) VALUES (?, ?)`, "c2", "a@example.com"), true},
				{"not null", exec(`INSERT INTO `+child+` (id, email) VALUES (?, NULL)`, "c3"), false},
				{"foreign key", exec(`INSERT INTO `+child+` (id, email, parent_id) VALUES (?, ?, ?)`, "c4", "d@example.com", "no-such-parent"), false},
				{"check", exec(`INSERT INTO `+child+` (id, email) VALUES (?, ?)`, "c5", "forbidden"), false},
				{"syntax", exec(`INSERT INTO ` + repotest.RandomName("nowhere") + ` VALUES (1)`), false},
			})
			require.NoError(t, exec(`INSERT INTO `+child+` (id, email) VALUES (?, ?)`, "c6", "e@example.com"))
			err := exec(`UPDATE `+child+` SET email = ? WHERE id = ?`, "a@example.com", "c6")
			require.True(t, repository.IsUniqueViolation(err), "a unique violation by UPDATE: %v", err)
		})
	}
}

func TestIsUniqueViolationOfNonDatabaseErrors(t *testing.T) {
	require.False(t, repository.IsUniqueViolation(nil))
	require.False(t, repository.IsUniqueViolation(errors.New("duplicate key value violates unique constraint")),
		"message text is never trusted")
	require.False(t, repository.IsUniqueViolation(sql.ErrNoRows))
}
