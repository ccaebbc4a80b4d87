package sqlstore

import (
	"database/sql"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// The store runs on the public executor of package sqlexec.
type (
	Executor = sqlexec.Executor
	Row      = sqlexec.Row
	Rows     = sqlexec.Rows
	DB       = sqlexec.DB
)

// StdDB adapts a database/sql pool; nil stays nil.
func StdDB(db *sql.DB) DB { return sqlexec.Std(db) }

// StdQuerier adapts a caller's transaction (*sql.Tx, *sql.Conn).
func StdQuerier(q repository.Querier) Executor { return sqlexec.StdTx(q) }

// OrNil returns v, or nil when err is not nil, and err: a backend's
// constructor wrapping a store it failed to make returns no wrapper.
func OrNil[T any](v *T, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return v, nil
}
