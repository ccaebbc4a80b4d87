// Package migration holds the tests of the shipped migration files —
// the inbox's, the version guard's and the outbox's, for every dialect:
// versions recorded, tables from before versioning adopted, and the files
// applied by golang-migrate giving a schema the stores and Migrate accept.
//
// It is a module of its own (tests/migration/go.mod) so that
// golang-migrate, which only these tests use, stays out of the library's
// go.mod. Run it from the repository root like every module:
//
//	go test ./tests/migration/...
package migration

import (
	"errors"
	"io/fs"
	"testing"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/source/iofs"
)

// GolangMigrate applies every up migration in dir of fsys with
// golang-migrate through drv (name is the database name it reports), and
// closes the migration, and so drv, before it returns. Files already
// applied are no error; any other failure fails t.
func GolangMigrate(t testing.TB, fsys fs.FS, dir, name string, drv database.Driver) {
	t.Helper()
	src, err := iofs.New(fsys, dir)
	if err != nil {
		t.Fatalf("golang-migrate: source %s: %v", dir, err)
	}
	m, err := migrate.NewWithInstance("iofs", src, name, drv)
	if err != nil {
		t.Fatalf("golang-migrate: %s: %v", dir, err)
	}
	defer m.Close()
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		t.Fatalf("golang-migrate: up %s: %v", dir, err)
	}
}
