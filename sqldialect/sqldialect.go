// Package sqldialect names the SQL databases the module runs on. It is a
// leaf: the outbox and the stores take the same value, so a program names
// its database once,
//
//	repo, _ := postgres.NewRepository(db, postgres.Config{})
//	ob, _ := outbox.New(outbox.Config{Dialect: postgres.Dialect})
//
// where postgres.Dialect is sqldialect.PostgreSQL. Each database's SQL is
// on one page of the module (internal/sqlstore: postgres.go, mysql.go,
// sqlite.go).
package sqldialect

import "errors"

// Dialect names a SQL database.
type Dialect string

const (
	// PostgreSQL 10+ (the outbox's shipped schema uses CREATE OR REPLACE
	// TRIGGER, so its Migrate needs 14+), through pgx/v5: database/sql
	// with its stdlib driver, or natively (repository/postgres's pgx
	// NewPgxRepository, outbox/pgxoutbox).
	PostgreSQL Dialect = "postgres"
	// MySQL covers MySQL 8.0+ and MariaDB 10.6+ (InnoDB; FOR UPDATE SKIP
	// LOCKED), through github.com/go-sql-driver/mysql.
	MySQL Dialect = "mysql"
	// SQLite 3.35+, through modernc.org/sqlite with a *sql.DB from
	// repository/sqlite's Open or DSN (BEGIN IMMEDIATE, WAL).
	SQLite Dialect = "sqlite"
)

// Valid reports whether d is one of the dialects above.
func (d Dialect) Valid() bool { return d == PostgreSQL || d == MySQL || d == SQLite }

// SQLState returns the SQLSTATE of the first error in err's chain with a
// SQLState() string method (pgx's *pgconn.PgError, lib/pq's *pq.Error),
// or "" when there is none: the way the module recognises PostgreSQL
// errors, by code.
func SQLState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}
