package postgres_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

func TestVersionGuardConformance(t *testing.T) {
	db := testenv.Postgres(t)
	repotest.RunVersionGuard(t, repotest.VersionBackend{
		Name: "postgres",
		DB:   db,
		New: func(t *testing.T, table string) (repotest.VersionStore, error) {
			s, err := postgres.NewVersionStore(db, postgres.VersionConfig{Table: table})
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() {
				_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+table+`"`)
				require.NoError(t, err)
			})
			if err := s.Migrate(t.Context()); err != nil {
				return nil, err
			}
			return s, s.Migrate(t.Context()) // idempotent
		},
	})
}
