package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

// TestPartitionedConformance runs the whole inbox suite on the
// partitioned layout, with hourly partitions so that cleanup has whole
// partitions to drop within the suite's few hours of expiries.
func TestPartitionedConformance(t *testing.T) {
	db := testenv.Postgres(t)
	repotest.Run(t, repotest.Backend{
		Name: "postgres-partitioned",
		DB:   db,
		Features: repotest.Features{Transactional: true, TwoPhase: true, Operator: true, Stats: true,
			CleanupInterval: time.Hour},
		New: func(t *testing.T, table string) (repotest.Repository, error) {
			repo, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{
				Table: table, Interval: time.Hour, Ahead: 2 * time.Hour,
			})
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

func TestPartitionedConfigIsValidated(t *testing.T) {
	db := testenv.Postgres(t)
	for name, c := range map[string]postgres.PartitionedConfig{
		"interval not dividing a day": {Interval: 7 * time.Hour},
		"interval under a minute":     {Interval: time.Second},
		"negative ahead":              {Ahead: -time.Hour},
	} {
		_, err := postgres.NewPartitionedRepository(db, c)
		require.ErrorIs(t, err, repository.ErrInvalidParams, name)
	}
	_, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: "bad;table"})
	require.ErrorIs(t, err, repository.ErrInvalidTableName)
}
