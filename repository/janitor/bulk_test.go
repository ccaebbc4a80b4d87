package janitor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/sqlstoretest"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

// The retention test of issue 3: 100,000 expired records are removed while
// claims keep succeeding. Each backend supplies its set-based seeding
// statement; the rest is shared.

// bulkRepo is what the test needs from a backend's repository.
type bulkRepo interface {
	repository.Driver[*sql.Tx]
	repository.Cleaner
}

// bulkTarget is one backend on a fresh table of its own.
type bulkTarget struct {
	db   *sql.DB
	repo bulkRepo
	// expired is how many expired records to seed; default 100,000.
	expired int
	// seed inserts n completed records of consumer, keys prefix1 … prefixN,
	// created at createdAt and expiring at expiresAt, in one statement.
	seed func(ctx context.Context, consumer, prefix string, n int, createdAt, expiresAt time.Time) error
	// countSQL counts the records of the consumer given as its argument.
	countSQL string
}

func (b bulkTarget) count(t *testing.T, consumer string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRowContext(t.Context(), b.countSQL, consumer).Scan(&n))
	return n
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: seeds and cleans 100k rows; make test runs it")
	}
}

// openBulk returns backend b's repository on a fresh migrated table that
// is dropped when the test ends.
func openBulk(t *testing.T, b sqlstoretest.Backend) (*sql.DB, string, bulkRepo) {
	table := repotest.RandomName("janitor_bulk")
	repo, err := b.Inbox(table)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := b.DB.ExecContext(context.Background(), `DROP TABLE IF EXISTS `+b.Quote+table+b.Quote)
		require.NoError(t, err)
	})
	require.NoError(t, repo.Migrate(t.Context()))
	bulk, ok := repo.(bulkRepo)
	require.True(t, ok, "the %s repository is no repository.Driver[*sql.Tx]", b.Name)
	return b.DB, table, bulk
}

func TestJanitor100kPostgres(t *testing.T) {
	skipShort(t)
	db, table, repo := openBulk(t, sqlstoretest.Postgres(t))

	runBulkCleanup(t, bulkTarget{
		db:   db,
		repo: repo,
		seed: func(ctx context.Context, consumer, prefix string, n int, createdAt, expiresAt time.Time) error {
			_, err := db.ExecContext(ctx, `INSERT INTO "`+table+`"
	(consumer, dedup_key, state, attempts, created_at, completed_at, expires_at)
SELECT $1, $2 || n, 'completed', 1, $3, $3, $4 FROM generate_series(1, $5::int) AS s(n)`,
				consumer, prefix, createdAt, expiresAt, n)
			return err
		},
		countSQL: `SELECT COUNT(*) FROM "` + table + `" WHERE consumer = $1`,
	})
}

func TestJanitor100kSQLite(t *testing.T) {
	skipShort(t)
	db, table, repo := openBulk(t, sqlstoretest.SQLite(t))

	expired := 100_000
	if raceDetector {
		// Under -race the SQLite engine runs instrumented, ten times slower;
		// a fifth of the rows keeps this test within its budget. Run it
		// without -race for the full 100,000.
		expired = 20_000
	}
	runBulkCleanup(t, bulkTarget{
		db:      db,
		repo:    repo,
		expired: expired,
		// The sqlite backend stores timestamps as Unix microseconds.
		seed: func(ctx context.Context, consumer, prefix string, n int, createdAt, expiresAt time.Time) error {
			_, err := db.ExecContext(ctx, `WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < ?5)
INSERT INTO "`+table+`" (consumer, dedup_key, state, attempts, created_at, completed_at, expires_at)
SELECT ?1, ?2 || n, 'completed', 1, ?3, ?3, ?4 FROM s`,
				consumer, prefix, createdAt.UnixMicro(), expiresAt.UnixMicro(), n)
			return err
		},
		countSQL: `SELECT COUNT(*) FROM "` + table + `" WHERE consumer = ?`,
	})
}

func TestJanitor100kMariaDB(t *testing.T) {
	skipShort(t)
	db, table, repo := openBulk(t, sqlstoretest.MySQL(t))

	runBulkCleanup(t, bulkTarget{
		db:   db,
		repo: repo,
		// seq_1_to_N is MariaDB's Sequence engine (MySQL 8 would need a
		// recursive CTE and a raised cte_max_recursion_depth).
		seed: func(ctx context.Context, consumer, prefix string, n int, createdAt, expiresAt time.Time) error {
			_, err := db.ExecContext(ctx, fmt.Sprintf("INSERT INTO `"+table+"`"+`
	(consumer, dedup_key, state, attempts, created_at, completed_at, expires_at)
SELECT ?, CONCAT(?, seq), 'completed', 1, ?, ?, ? FROM seq_1_to_%d`, n),
				consumer, prefix, createdAt.UTC(), createdAt.UTC(), expiresAt.UTC())
			return err
		},
		countSQL: "SELECT COUNT(*) FROM `" + table + "` WHERE consumer = ?",
	})
}

// runBulkCleanup seeds 100,000 (b.expired) expired and 1,000 live records,
// then drains the expired ones with a janitor pass while claimers keep
// claiming fresh keys, each in its own transaction.
func runBulkCleanup(t *testing.T, b bulkTarget) {
	const (
		live     = 1_000
		claimers = 4
	)
	expired := b.expired
	if expired == 0 {
		expired = 100_000
	}
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)

	seedStart := time.Now()
	require.NoError(t, b.seed(ctx, "expired", "e", expired, now.Add(-8*24*time.Hour), now.Add(-time.Hour)))
	require.NoError(t, b.seed(ctx, "live", "l", live, now.Add(-time.Hour), now.Add(time.Hour)))
	seedTook := time.Since(seedStart)
	require.Equal(t, expired, b.count(t, "expired"))
	require.Equal(t, live, b.count(t, "live"))

	var batches atomic.Int64
	j, err := janitor.NewJanitor(b.repo, janitor.Config{
		Now: func() time.Time { return now },

		Observer: janitor.ObserverFunc(func(context.Context, janitor.Batch) { batches.Add(1) }),
	})
	require.NoError(t, err)
	defer j.Close()

	var (
		claimed    atomic.Int64 // committed fresh claims
		cleaning   atomic.Bool  // set while the janitor pass runs
		slowest    atomic.Int64 // longest claim transaction during cleanup, ns
		stop       = make(chan struct{})
		warm       sync.WaitGroup // each claimer has committed once
		wg         sync.WaitGroup
		claimErrMu sync.Mutex
		claimErrs  []error
	)
	warm.Add(claimers)
	for g := range claimers {
		wg.Go(func() {
			warming := true
			defer func() {
				if warming {
					warm.Done()
				}
			}()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				during := cleaning.Load()
				if err := claimFresh(ctx, b, fmt.Sprintf("g%d-%d", g, i), now); err != nil {
					claimErrMu.Lock()
					claimErrs = append(claimErrs, err)
					claimErrMu.Unlock()
					return
				}
				claimed.Add(1)
				if took := int64(time.Since(start)); during && took > slowest.Load() {
					slowest.Store(took) // one writer per goroutine; a lost update only understates by a race
				}
				if warming {
					warming = false
					warm.Done()
				}
			}
		})
	}
	warm.Wait()

	before := claimed.Load()
	cleaning.Store(true)
	start := time.Now()
	deleted, err := j.RunOnce(ctx)
	took := time.Since(start)
	cleaning.Store(false)
	during := claimed.Load() - before
	close(stop)
	wg.Wait()

	require.NoError(t, errors.Join(claimErrs...), "every concurrent claim succeeds")
	require.NoError(t, err)
	require.Equal(t, expired, deleted)
	require.Zero(t, b.count(t, "expired"), "every expired record is removed")
	require.Equal(t, live, b.count(t, "live"), "every live record is untouched")
	require.Equal(t, int(claimed.Load()), b.count(t, "claims"), "every committed claim is stored")
	require.Positive(t, during, "claims complete while the janitor runs")

	t.Logf("seeded %d expired + %d live records in %s", expired, live, seedTook.Round(time.Millisecond))
	t.Logf("janitor removed %d records in %s (%d batches); %d claims by %d goroutines completed meanwhile (%.0f/s), slowest claim transaction %s",
		deleted, took.Round(time.Millisecond), batches.Load(), during, claimers,
		float64(during)/took.Seconds(), time.Duration(slowest.Load()).Round(time.Microsecond))
}

// claimFresh claims a key nobody has claimed, in a transaction of its own,
// and commits.
func claimFresh(ctx context.Context, b bulkTarget, key string, now time.Time) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	c, err := claimTx(ctx, b.repo, tx, repository.ClaimParams{
		Consumer: "claims", Key: key, PayloadHash: repository.HashPayload([]byte(key)),
		Now: now, ExpiresAt: now.Add(24 * time.Hour),
	})
	if err != nil {
		return fmt.Errorf("claim %s: %w", key, err)
	}
	if !c.Claimed {
		return fmt.Errorf("claim %s: a fresh key was reported as a duplicate", key)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit %s: %w", key, err)
	}
	return nil
}
