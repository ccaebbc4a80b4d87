package postgres_test

import (
	"context"
	"testing"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
	"github.com/stretchr/testify/require"
)

func TestConformance(t *testing.T) {
	db := testenv.Postgres(t)
	repotest.Run(t, repotest.Backend{
		Name:     "postgres",
		DB:       db,
		Features: repotest.Features{Transactional: true, TwoPhase: true, Operator: true, Stats: true},
		New: func(t *testing.T, table string) (repotest.Repository, error) {
			repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() {
				_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+table+`"`)
				require.NoError(t, err)
			})
			return repo, repo.Migrate(t.Context())
		},
	})
}

func TestSchemaFileMatchesMigrate(t *testing.T) {
	require.Equal(t, postgres.SchemaDDL(repository.DefaultTableName), postgres.SchemaSQL,
		"schema.sql is stale: regenerate it with `go run ./internal/cmd/gen-schema`")
}

func BenchmarkRepository(b *testing.B) {
	db := testenv.Postgres(b)
	repotest.Bench(b, repotest.BenchBackend{
		Name:     "postgres",
		DB:       db,
		Features: repotest.Features{Transactional: true, TwoPhase: true},
		New: func(tb testing.TB, table string) (repotest.Repository, error) {
			repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
			if err != nil {
				return nil, err
			}
			tb.Cleanup(func() {
				_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+table+`"`)
				require.NoError(tb, err)
			})
			return repo, repo.Migrate(context.Background())
		},
	})
}
