package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// statements counts the statements a claim sends.
type statements struct {
	sqlstore.Executor
	n int
}

func (e *statements) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	e.n++
	return e.Executor.Exec(ctx, query, args...)
}

func (e *statements) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	e.n++
	return e.Executor.QueryRow(ctx, query, args...)
}

func (e *statements) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	e.n++
	return e.Executor.Query(ctx, query, args...)
}

// TestPartitionedClaimStatements: resolving the table in the lock's
// statement and looking again for a vanished record cost no round trip:
// a claim is the lock and the insert, a duplicate adds the read.
func TestPartitionedClaimStatements(t *testing.T) {
	db := testenv.Postgres(t)
	repo, _ := newPartitioned(t, db)
	now := time.Now()
	for _, want := range []int{2, 3} {
		tx, err := db.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		ex := &statements{Executor: sqlstore.StdQuerier(tx)}
		_, err = repo.ClaimOn(t.Context(), ex, repository.ClaimParams{
			Consumer: "billing", Key: "order-1", PayloadHash: []byte{1}, Now: now, ExpiresAt: now.Add(time.Hour),
		})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		require.Equal(t, want, ex.n)
	}
}

// afterInsert runs hook once, after the first INSERT it executes, before
// the claim's next statement: the test's handle on the interleaving.
type afterInsert struct {
	sqlstore.Executor
	once sync.Once
	hook func()
}

func (e *afterInsert) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	n, err := e.Executor.Exec(ctx, query, args...)
	if strings.HasPrefix(query, "INSERT") {
		e.once.Do(e.hook)
	}
	return n, err
}

// seedOld claims keys with expiries two and a half hours ago, so that
// their records sit in a partition that cleanup before an hour ago
// drops whole.
func seedOld(t *testing.T, db *sql.DB, repo *postgres.PartitionedRepository, now time.Time, keys ...string) {
	t.Helper()
	tx, err := db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	params := make([]repository.ClaimParams, len(keys))
	for i, key := range keys {
		params[i] = repository.ClaimParams{Consumer: "billing", Key: key, PayloadHash: []byte{1},
			Now: now.Add(-3 * time.Hour), ExpiresAt: now.Add(-150 * time.Minute)}
	}
	claims, err := repo.ClaimBatchTx(t.Context(), tx, params)
	require.NoError(t, err)
	for _, c := range claims {
		require.True(t, c.Claimed)
	}
	require.NoError(t, tx.Commit())
}

// TestPartitionedClaimRetriesARecordItsPartitionLost: a claim's insert
// sees the key's record in an expired partition; cleanup then detaches
// that partition (the first, committed step of DETACH … CONCURRENTLY,
// which then waits for the claim's transaction) before the claim reads
// the record. The read finds nothing; the claim looks again, finds the
// key free and claims it, instead of failing.
func TestPartitionedClaimRetriesARecordItsPartitionLost(t *testing.T) {
	db := testenv.Postgres(t)
	repo, table := newPartitioned(t, db)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	now := time.Now()
	seedOld(t, db, repo, now, "order-1")

	cleaned := make(chan error, 1)
	var deleted int
	ex := &afterInsert{hook: func() {
		go func() {
			var err error
			deleted, err = repo.DeleteExpired(ctx, now.Add(-time.Hour), 1000)
			cleaned <- err
		}()
		// Wait until the detach has committed its first step.
		for {
			var pending bool
			err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits WHERE inhparent = $1::regclass AND inhdetachpending)`,
				`"`+table+`"`).Scan(&pending)
			require.NoError(t, err)
			if pending {
				return
			}
			select {
			case err := <-cleaned:
				t.Fatalf("cleanup ended before detaching: %v", err)
			case <-ctx.Done():
				t.Fatal("no detach pending before the deadline")
			case <-time.After(5 * time.Millisecond):
			}
		}
	}}

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	ex.Executor = sqlstore.StdQuerier(tx)
	c, err := repo.ClaimOn(ctx, ex, repository.ClaimParams{
		Consumer: "billing", Key: "order-1", PayloadHash: []byte{1}, Now: now, ExpiresAt: now.Add(time.Hour),
	})
	require.NoError(t, err)
	require.True(t, c.Claimed, "the expired record's partition is gone: the key is free")
	require.NoError(t, tx.Commit())

	require.NoError(t, <-cleaned)
	require.Equal(t, 1, deleted, "cleanup dropped the expired record")
	var rows int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "`+table+`" WHERE dedup_key = 'order-1'`).Scan(&rows))
	require.Equal(t, 1, rows)
}

// TestPartitionedClaimsSurviveCleanup counts: many keys recorded in an
// expired partition are claimed again, each twice at once, while cleanup
// drops that partition. No claim fails, and each key has one winner.
func TestPartitionedClaimsSurviveCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	db := testenv.Postgres(t)
	repo, _ := newPartitioned(t, db)
	ctx := t.Context()
	const rounds, keys = 4, 150
	failed, doubled := 0, 0
	for r := range rounds {
		now := time.Now()
		names := make([]string, keys)
		for k := range names {
			names[k] = fmt.Sprintf("order-%d-%d", r, k)
		}
		seedOld(t, db, repo, now, names...)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			winners = map[string]int{}
		)
		wg.Go(func() {
			if _, err := repo.DeleteExpired(ctx, now.Add(-time.Hour), 1000); err != nil {
				t.Error(err)
			}
		})
		for _, key := range names {
			for range 2 {
				wg.Go(func() {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						t.Error(err)
						return
					}
					defer func() { _ = tx.Rollback() }()
					c, err := repo.ClaimTx(ctx, tx, repository.ClaimParams{
						Consumer: "billing", Key: key, PayloadHash: []byte{1}, Now: now, ExpiresAt: now.Add(time.Hour),
					})
					if err == nil {
						err = tx.Commit()
					}
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						failed++
						t.Log(err)
					} else if c.Claimed {
						winners[key]++
					}
				})
			}
		}
		wg.Wait()
		for _, n := range winners {
			if n > 1 {
				doubled++
			}
		}
	}
	t.Logf("%d claims during cleanup: %d failed, %d keys doubled", rounds*keys*2, failed, doubled)
	require.Zero(t, failed)
	require.Zero(t, doubled)
}
