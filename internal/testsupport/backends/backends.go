// Package backends opens every storage backend on fresh tables for the
// tests of packages built on the storage contracts (once, httpidem,
// dupetest). Services come from internal/testsupport/testenv: a missing one skips the
// subtest, or fails it under CI=true.
package backends

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"slices"
	"testing"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// TwoPhase is a backend implementing the two-phase contract.
type TwoPhase interface {
	repository.TwoPhase
	repository.Reader
}

// SQL is a SQL backend on database/sql: both contracts on DB.
type SQL interface {
	TwoPhase
	repository.Driver[*sql.Tx]
}

// Names of the backends, in the order ForEach runs them.
var (
	TwoPhaseNames = []string{"memory", "redis", "postgres", "mysql", "sqlite"}
	SQLNames      = []string{"postgres", "mysql", "sqlite"}
)

// Store is one opened backend.
type Store struct {
	Name string
	Repo TwoPhase
	// DB and SQL are set for the SQL backends only.
	DB  *sql.DB
	SQL SQL
}

// Open opens backend name on a fresh table (or Redis key prefix) that is
// dropped when t ends.
func Open(t testing.TB, name string) *Store {
	t.Helper()
	s := &Store{Name: name}
	switch name {
	case "memory":
		s.Repo = memory.NewRepository()
		return s
	case "redis":
		client := testenv.Redis(t)
		repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: testenv.RedisPrefix(t, client)})
		if err != nil {
			t.Fatal(err)
		}
		s.Repo = repo
		return s
	}
	table := RandomName("once")
	var err error
	switch name {
	case "postgres":
		s.DB = testenv.Postgres(t)
		r, e := postgres.NewRepository(s.DB, postgres.Config{Table: table})
		if err = e; err == nil {
			err = r.Migrate(t.Context())
		}
		s.SQL = r
	case "mysql":
		s.DB = testenv.MySQL(t)
		r, e := mysql.NewRepository(s.DB, mysql.Config{Table: table})
		if err = e; err == nil {
			err = r.Migrate(t.Context())
		}
		s.SQL = r
	case "sqlite":
		s.DB = testenv.SQLite(t)
		r, e := sqlite.NewRepository(s.DB, sqlite.Config{Table: table})
		if err = e; err == nil {
			err = r.Migrate(t.Context())
		}
		s.SQL = r
	default:
		t.Fatalf("unknown backend %q", name)
	}
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	s.Repo = s.SQL
	db := s.DB
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table) })
	return s
}

// ForEach runs fn as a parallel subtest per backend in names (all
// two-phase backends when names is empty).
func ForEach(t *testing.T, names []string, fn func(t *testing.T, s *Store)) {
	if len(names) == 0 {
		names = TwoPhaseNames
	}
	for _, name := range names {
		if !slices.Contains(TwoPhaseNames, name) {
			t.Fatalf("unknown backend %q", name)
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, Open(t, name))
		})
	}
}

// RandomName returns prefix_ followed by 12 random hex digits, a table
// name or key no other test uses.
func RandomName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}
