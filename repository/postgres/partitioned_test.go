package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
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
		Features: repotest.Features{Transactional: true, TwoPhase: true, Operator: true, Stats: true, Batch: true,
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

// TestPartitionedInboxRunsEachMessageOnce delivers every message of a
// batch many times at once through the inbox middleware on the
// partitioned repository, with and without group commit: each handler's business write commits exactly
// once per message, and every other copy is acknowledged as a duplicate.
func TestPartitionedInboxRunsEachMessageOnce(t *testing.T) {
	for name, batch := range map[string]int{"one transaction each": 0, "group commit": 16} {
		t.Run(name, func(t *testing.T) { runPartitionedInbox(t, batch) })
	}
}

func runPartitionedInbox(t *testing.T, batch int) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	table := "inbox_parted_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	effects := table + "_effects"
	repo, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+table+`", "`+effects+`"`)
		require.NoError(t, err)
	})
	require.NoError(t, repo.Migrate(ctx))
	_, err = db.ExecContext(ctx, `CREATE TABLE "`+effects+`" (message_uuid TEXT NOT NULL)`)
	require.NoError(t, err)

	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing",
		Batch: middleware.BatchConfig{MaxMessages: batch}})
	require.NoError(t, err)
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, txErr := idempotency.Tx[*sql.Tx](msg.Context())
		if txErr != nil {
			return nil, txErr
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO "`+effects+`" (message_uuid) VALUES ($1)`, msg.UUID)
		return nil, err
	})

	const messages, copies = 8, 16
	var wg sync.WaitGroup
	errs := make(chan error, messages*copies)
	start := make(chan struct{})
	for m := range messages {
		for range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := handler(message.NewMessage(fmt.Sprintf("order-%d", m), []byte("charge")))
				errs <- err
			}()
		}
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	rows, err := db.QueryContext(ctx, `SELECT message_uuid, COUNT(*) FROM "`+effects+`" GROUP BY message_uuid`)
	require.NoError(t, err)
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		got[id] = n
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, messages)
	for id, n := range got {
		require.Equal(t, 1, n, "effects of %s", id)
	}
}

// BenchmarkPartitionedRepository runs the storage benchmarks on the
// partitioned layout with its defaults (daily partitions, 8 days ahead:
// a claim probes 9 partitions); compare with BenchmarkRepository.
func BenchmarkPartitionedRepository(b *testing.B) {
	db := testenv.Postgres(b)
	repotest.Bench(b, repotest.BenchBackend{
		Name: "postgres-partitioned", DB: db,
		Features: repotest.Features{Transactional: true, TwoPhase: true, CleanupInterval: 24 * time.Hour},
		New: func(tb testing.TB, table string) (repotest.Repository, error) {
			repo, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: table})
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

// newPartitioned returns a migrated partitioned repository on a fresh
// table (hourly partitions, two hours ahead) over db.
func newPartitioned(t *testing.T, db *sql.DB) (*postgres.PartitionedRepository, string) {
	t.Helper()
	table := "parted_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	repo, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: table, Interval: time.Hour, Ahead: 2 * time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "`+table+`"`)
		require.NoError(t, err)
	})
	require.NoError(t, repo.Migrate(t.Context()))
	return repo, table
}

// TestPartitionedClaimRefusesRepeatableRead: under REPEATABLE READ the
// snapshot predates the lock wait and could hide the winner's row, so the
// claim refuses to run rather than risk a second winner.
func TestPartitionedClaimRefusesRepeatableRead(t *testing.T) {
	db := testenv.Postgres(t)
	repo, _ := newPartitioned(t, db)
	now := time.Now()
	tx, err := db.BeginTx(t.Context(), &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = claimTx(t.Context(), repo, tx, repository.ClaimParams{
		Consumer: "billing", Key: "order-1", PayloadHash: []byte{1}, Now: now, ExpiresAt: now.Add(time.Hour),
	})
	require.ErrorIs(t, err, repository.ErrInvalidParams)
	require.ErrorContains(t, err, "READ COMMITTED")
}

// TestPartitionedClaimCreatesItsPartitionOnOneConnection: a claim whose
// partition does not exist yet creates it in the caller's transaction, so
// a pool of one connection, held by that transaction, does not deadlock.
func TestPartitionedClaimCreatesItsPartitionOnOneConnection(t *testing.T) {
	db, err := sql.Open("pgx", testenv.PostgresDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(1)
	repo, table := newPartitioned(t, db)

	now := time.Now()
	far := now.Add(30 * 24 * time.Hour) // far past Ahead: no partition yet
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	c, err := claimTx(ctx, repo, tx, repository.ClaimParams{
		Consumer: "billing", Key: "order-1", PayloadHash: []byte{1}, Now: now, ExpiresAt: far,
	})
	require.NoError(t, err)
	require.True(t, c.Claimed)
	require.NoError(t, tx.Commit())

	var partition string
	require.NoError(t, db.QueryRowContext(ctx, `SELECT tableoid::regclass::text FROM "`+table+`" WHERE dedup_key = 'order-1'`).Scan(&partition))
	require.Contains(t, partition, far.UTC().Truncate(time.Hour).Format("20060102t1504"))
}

// claimTx claims p alone in tx through d, as the inbox does for one
// delivery.
func claimTx(ctx context.Context, d repository.Driver[*sql.Tx], tx *sql.Tx, p repository.ClaimParams) (repository.Claim, error) {
	claims, err := d.Claim(ctx, tx, []repository.ClaimParams{p})
	if err != nil {
		return repository.Claim{}, err
	}
	return claims[0], nil
}
