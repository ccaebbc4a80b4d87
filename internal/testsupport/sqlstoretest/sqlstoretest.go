// Package sqlstoretest wires a SQL backend into the conformance suites
// (repotest.Run, repotest.RunVersionGuard, repotest.Bench), so that a
// backend's test names only its constructors:
//
//	func TestConformance(t *testing.T) { sqlstoretest.Run(t, sqlstoretest.Postgres(t)) }
package sqlstoretest

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// Inbox is a backend's Repository: the suite's contracts and Migrate.
// The transactional contract (repository.Driver[*sql.Tx]) is checked by
// the suite where Backend.Transactional says the backend has it.
type Inbox interface {
	repository.TwoPhase
	repository.Operator
	repository.Stats
	repotest.Repository
	Migrate(context.Context) error
	Migrations(context.Context) ([]repository.Migration, error)
}

// Versions is a backend's VersionStore.
type Versions interface {
	repotest.VersionStore
	Migrate(context.Context) error
	Migrations(context.Context) ([]repository.Migration, error)
}

// Backend is a SQL backend under test.
type Backend struct {
	Name string
	DB   *sql.DB
	// Transactional: the repository is a repository.Driver[*sql.Tx], the
	// suite's transactions (not on pgx, whose driver's are pgx.Tx: the
	// middleware's pgx tests cover it).
	Transactional bool
	// Quote quotes the table names the suites pick, to drop them.
	Quote    string
	Inbox    func(table string) (Inbox, error)
	Versions func(table string) (Versions, error)
}

// Postgres is the PostgreSQL backend on the test database.
func Postgres(tb testing.TB) Backend {
	db := testenv.Postgres(tb)
	return Backend{Name: "postgres", DB: db, Quote: `"`, Transactional: true,
		Inbox: func(t string) (Inbox, error) { return postgres.NewRepository(db, postgres.Config{Table: t}) },
		Versions: func(t string) (Versions, error) {
			return postgres.NewVersionStore(db, postgres.Config{Table: t})
		}}
}

// PostgresPgx is the PostgreSQL backend over a pgxpool.Pool: the store
// runs its own statements on pgx. Its transactions are pgx.Tx, so the
// suites' transactional cases (on *sql.Tx) and the version guard's are
// left to the middleware's pgx tests; the two-phase, operator and stats
// cases run here.
func PostgresPgx(tb testing.TB) Backend {
	db, pool := testenv.Postgres(tb), testenv.PgxPool(tb)
	return Backend{Name: "postgres-pgx", DB: db, Quote: `"`,
		Inbox: func(t string) (Inbox, error) {
			return postgres.NewPgxRepository(pool, postgres.Config{Table: t})
		}}
}

// MySQL is the MySQL/MariaDB backend on the test database.
func MySQL(tb testing.TB) Backend {
	db := testenv.MySQL(tb)
	return Backend{Name: "mysql", DB: db, Quote: "`", Transactional: true,
		Inbox:    func(t string) (Inbox, error) { return mysql.NewRepository(db, mysql.Config{Table: t}) },
		Versions: func(t string) (Versions, error) { return mysql.NewVersionStore(db, mysql.Config{Table: t}) }}
}

// SQLite is the SQLite backend on a fresh database file.
func SQLite(tb testing.TB) Backend {
	db := testenv.SQLite(tb)
	return Backend{Name: "sqlite", DB: db, Quote: `"`, Transactional: true,
		Inbox:    func(t string) (Inbox, error) { return sqlite.NewRepository(db, sqlite.Config{Table: t}) },
		Versions: func(t string) (Versions, error) { return sqlite.NewVersionStore(db, sqlite.Config{Table: t}) }}
}

// Run runs the inbox and version guard conformance suites on tables that
// New migrates (twice, to check that it is idempotent) and drops after.
func Run(t *testing.T, b Backend) {
	t.Run("Inbox", func(t *testing.T) {
		repotest.Run(t, repotest.Backend{
			Name:     b.Name,
			DB:       b.DB,
			Features: repotest.Features{Transactional: b.Transactional, TwoPhase: true, Operator: true, Stats: true, Batch: b.Transactional},
			New: func(t *testing.T, table string) (repotest.Repository, error) {
				repo, err := b.Inbox(table)
				if err != nil {
					return nil, err
				}
				b.dropAfter(t, table)
				return repo, repo.Migrate(t.Context())
			},
		})
	})
	if b.Versions == nil {
		return
	}
	t.Run("VersionGuard", func(t *testing.T) {
		repotest.RunVersionGuard(t, repotest.VersionBackend{
			Name: b.Name,
			DB:   b.DB,
			New: func(t *testing.T, table string) (repotest.VersionStore, error) {
				s, err := b.Versions(table)
				if err != nil {
					return nil, err
				}
				b.dropAfter(t, table)
				if err := s.Migrate(t.Context()); err != nil {
					return nil, err
				}
				return s, s.Migrate(t.Context())
			},
		})
	})
}

// Bench runs the storage benchmarks.
func Bench(tb *testing.B, b Backend) {
	repotest.Bench(tb, repotest.BenchBackend{
		Name:     b.Name,
		DB:       b.DB,
		Features: repotest.Features{Transactional: b.Transactional, TwoPhase: true},
		New: func(tb testing.TB, table string) (repotest.Repository, error) {
			repo, err := b.Inbox(table)
			if err != nil {
				return nil, err
			}
			b.dropAfter(tb, table)
			return repo, repo.Migrate(context.Background())
		},
	})
}

func (b Backend) dropAfter(tb testing.TB, table string) {
	tb.Cleanup(func() {
		_, err := b.DB.ExecContext(context.Background(), `DROP TABLE IF EXISTS `+b.Quote+table+b.Quote)
		require.NoError(tb, err)
	})
}
