// Package sqlite is the embedded SQLite backend of the inbox, on the pure-Go
// modernc.org/sqlite driver (no cgo): the default for single-process
// services, tests and the quickstart.
//
//	db, err := sqlite.Open("inbox.db") // WAL, busy timeout, immediate transactions, one connection
//	if err != nil { … }
//	repo, err := sqlite.NewRepository(db, sqlite.Config{})
//	if err != nil { … }
//	if err := repo.Migrate(ctx); err != nil { … }
//
// SQLite has one writer at a time. Open makes every transaction take the
// write lock when it begins (BEGIN IMMEDIATE) and keeps one connection, so
// racing claims queue in Go's pool instead of polling SQLite's lock; a
// *sql.DB opened another way must do the same (see DSN). Claims and
// Acquire are INSERT … ON CONFLICT DO NOTHING on the primary key, as on
// PostgreSQL; every later two-phase change is one fenced UPDATE or DELETE.
package sqlite
