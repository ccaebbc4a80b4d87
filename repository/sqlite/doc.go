// Package sqlite is the embedded SQLite backend of the inbox, on the pure-Go
// modernc.org/sqlite driver (no cgo). It is the default for single-process
// services, tests and the quickstart.
//
//	db, err := sqlite.Open("inbox.db") // WAL, busy timeout, immediate transactions, one connection
//	if err != nil { … }
//	repo, err := sqlite.NewRepository(db, sqlite.Config{})
//	if err != nil { … }
//	if err := repo.Migrate(ctx); err != nil { … }
//
// SQLite has one writer at a time. Open configures every transaction to
// take the write lock when it begins (BEGIN IMMEDIATE), and keeps one
// connection so that racing claims queue in Go's pool instead of polling
// SQLite's lock (busy_timeout still covers other processes); the claim is `INSERT … ON CONFLICT DO NOTHING` against the
// primary key, as on PostgreSQL. A *sql.DB opened another way must do the
// same (see DSN).
//
// The two-phase contract (repository.TwoPhase) uses the same conditional
// insert for Acquire and one UPDATE or DELETE fenced by state and lease
// owner for every later state change.
package sqlite
