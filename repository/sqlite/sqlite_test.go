package sqlite_test

import (
	"testing"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/stretchr/testify/require"
)

func TestConformance(t *testing.T) {
	db := testenv.SQLite(t)
	repotest.Run(t, repotest.Backend{
		Name:     "sqlite",
		DB:       db,
		Features: repotest.Features{Transactional: true, TwoPhase: true, Operator: true, Stats: true},
		New: func(t *testing.T, table string) (repotest.Repository, error) {
			repo, err := sqlite.NewRepository(db, sqlite.Config{Table: table})
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() {
				_, err := db.Exec(`DROP TABLE IF EXISTS "` + table + `"`)
				require.NoError(t, err)
			})
			return repo, repo.Migrate(t.Context())
		},
	})
}

func TestSchemaFileMatchesMigrate(t *testing.T) {
	require.Equal(t, sqlite.SchemaDDL(repository.DefaultTableName), sqlite.SchemaSQL,
		"schema.sql is stale: regenerate it with `go run ./internal/cmd/gen-schema`")
}

func BenchmarkRepository(b *testing.B) {
	db := testenv.SQLite(b)
	repotest.Bench(b, repotest.BenchBackend{
		Name:     "sqlite",
		DB:       db,
		Features: repotest.Features{Transactional: true, TwoPhase: true},
		New: func(tb testing.TB, table string) (repotest.Repository, error) {
			repo, err := sqlite.NewRepository(db, sqlite.Config{Table: table})
			if err != nil {
				return nil, err
			}
			tb.Cleanup(func() {
				_, err := db.Exec(`DROP TABLE IF EXISTS "` + table + `"`)
				require.NoError(tb, err)
			})
			return repo, repo.Migrate(tb.Context())
		},
	})
}
