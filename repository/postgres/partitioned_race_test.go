package postgres_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// TestPartitionedClaimLocksTheTableNotItsSpelling races two claims of
// every key through two repositories that name one partitioned table
// differently: "t" and "public.t", and "s.t" and "t" under search_path s.
// The advisory lock that serialises claims must be the table's, not its
// spelling's, or both claims see the key absent and both win.
func TestPartitionedClaimLocksTheTableNotItsSpelling(t *testing.T) {
	db := testenv.Postgres(t)
	t.Run("t and public.t", func(t *testing.T) {
		table := "relp_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
		t.Cleanup(func() {
			_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "public"."`+table+`"`)
			require.NoError(t, err)
		})
		a := partitionedRepo(t, db, table)
		b := partitionedRepo(t, db, "public."+table)
		require.NoError(t, a.Migrate(t.Context()))
		raceSpellings(t, db, a, db, b, "public."+table)
	})
	t.Run("schema.t and t under search_path", func(t *testing.T) {
		inSchema, schema := testenv.PostgresSchema(t, "relp_")
		a := partitionedRepo(t, db, schema+".relp_x")
		b := partitionedRepo(t, inSchema, "relp_x")
		require.NoError(t, b.Migrate(t.Context()))
		raceSpellings(t, db, a, inSchema, b, schema+".relp_x")
	})
}

// TestPartitionedMaintenanceLocksTheTableNotItsSpelling: claims through
// "t" and "public.t" that need the same missing partition create it
// under one maintenance lock, so neither fails on the other's CREATE
// TABLE; cleanup through both spellings at once drops each partition
// once.
func TestPartitionedMaintenanceLocksTheTableNotItsSpelling(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	table := "relp_" + strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), `DROP TABLE IF EXISTS "public"."`+table+`"`)
		require.NoError(t, err)
	})
	repos := []*postgres.PartitionedRepository{partitionedRepo(t, db, table), partitionedRepo(t, db, "public."+table)}
	require.NoError(t, repos[0].Migrate(ctx))

	const partitions = 24
	now := time.Now()
	far := now.Add(30 * 24 * time.Hour) // past Ahead: the claims create the partitions
	var wg sync.WaitGroup
	errs := make(chan error, 2*partitions+2)
	for h := range partitions {
		for i, repo := range repos {
			wg.Go(func() {
				tx, err := db.BeginTx(ctx, nil)
				if err == nil {
					_, err = claimTx(ctx, repo, tx, repository.ClaimParams{Consumer: "billing", Key: fmt.Sprintf("order-%d-%d", h, i),
						PayloadHash: []byte{1}, Now: now, ExpiresAt: far.Add(time.Duration(h) * time.Hour)})
				}
				if err == nil {
					err = tx.Commit()
				} else if tx != nil {
					_ = tx.Rollback()
				}
				errs <- err
			})
		}
	}
	wg.Wait()
	for _, repo := range repos {
		wg.Go(func() {
			_, err := repo.DeleteExpired(ctx, far.Add(partitions*time.Hour), 1000)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var rows int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "`+table+`"`).Scan(&rows))
	require.Zero(t, rows, "records left after both cleanups")
}

// TestPartitionedPartitionsLiveWithTheirTable: "t" found further along
// the search_path than its first schema is the same table as "s.t", and
// both spellings create its partitions in s, the table's schema, so
// each finds the other's (before, "t" created them in the first schema
// of its search_path, where "s.t" never looked: its ATTACH then failed
// on the overlap, for every claim needing that partition).
func TestPartitionedPartitionsLiveWithTheirTable(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	_, home := testenv.PostgresSchema(t, "relp_home_")
	first, _ := testenv.PostgresSchema(t, "relp_first_", home)
	qualified := partitionedRepo(t, db, home+".relp_x")
	bare := partitionedRepo(t, first, "relp_x")
	require.NoError(t, qualified.Migrate(ctx))

	now := time.Now()
	far := now.Add(30 * 24 * time.Hour) // past Ahead: the claims create the partitions
	for i, side := range []struct {
		db   *sql.DB
		repo *postgres.PartitionedRepository
	}{{first, bare}, {db, qualified}, {first, bare}} {
		tx, err := side.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		c, err := claimTx(ctx, side.repo, tx, repository.ClaimParams{Consumer: "billing", Key: fmt.Sprintf("order-%d", i),
			PayloadHash: []byte{1}, Now: now, ExpiresAt: far.Add(time.Duration(i) * time.Minute)})
		require.NoError(t, err, "claim %d", i)
		require.True(t, c.Claimed)
		require.NoError(t, tx.Commit())
	}
	var rows, elsewhere int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(*) FILTER (WHERE n.nspname <> $1) FROM "`+home+`"."relp_x" r
JOIN pg_class c ON c.oid = r.tableoid JOIN pg_namespace n ON n.oid = c.relnamespace`, home).Scan(&rows, &elsewhere))
	require.Equal(t, 3, rows)
	require.Zero(t, elsewhere, "records in partitions outside the table's schema")
}

func partitionedRepo(t *testing.T, db *sql.DB, table string) *postgres.PartitionedRepository {
	t.Helper()
	repo, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: table, Interval: time.Hour, Ahead: 2 * time.Hour})
	require.NoError(t, err)
	return repo
}

// raceSpellings claims each of 400 keys twice at once, once through a
// (on dbA) and once through b (on dbB), each in its own transaction, and
// requires one winner per key and one row per key in table.
func raceSpellings(t *testing.T, dbA *sql.DB, a *postgres.PartitionedRepository, dbB *sql.DB, b *postgres.PartitionedRepository, table string) {
	const keys = 400
	ctx := t.Context()
	now := time.Now()
	// A redelivery computes a new expiry, which the primary key
	// (consumer, dedup_key, expires_at) does not stop: only the lock does.
	claim := func(db *sql.DB, repo *postgres.PartitionedRepository, key string, expires time.Time) (bool, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback() }()
		c, err := claimTx(ctx, repo, tx, repository.ClaimParams{
			Consumer: "billing", Key: key, PayloadHash: []byte{1}, Now: now, ExpiresAt: expires,
		})
		if err != nil {
			return false, err
		}
		return c.Claimed, tx.Commit()
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners = map[string]int{}
		errs    []error
		pairs   = make(chan struct{}, 8) // pairs in flight: both pools keep free connections
	)
	for k := range keys {
		key := fmt.Sprintf("order-%d", k)
		pairs <- struct{}{}
		start := make(chan struct{})
		var pair sync.WaitGroup
		for i, side := range []struct {
			db   *sql.DB
			repo *postgres.PartitionedRepository
		}{{dbA, a}, {dbB, b}} {
			wg.Add(1)
			pair.Add(1)
			go func() {
				defer wg.Done()
				defer pair.Done()
				<-start
				won, err := claim(side.db, side.repo, key, now.Add(time.Hour+time.Duration(i)*time.Minute))
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				if won {
					winners[key]++
				}
			}()
		}
		close(start)
		go func() { pair.Wait(); <-pairs }()
	}
	wg.Wait()
	require.Empty(t, errs, "%d claims failed", len(errs))
	doubled := 0
	for _, n := range winners {
		if n > 1 {
			doubled++
		}
	}
	var rows, distinct int
	require.NoError(t, dbA.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT dedup_key) FROM `+quoted(table)).Scan(&rows, &distinct))
	t.Logf("%d keys x 2 racing claims (%s): %d doubled, %d rows", keys, table, doubled, rows)
	require.Zero(t, doubled, "keys won by both claims")
	require.Equal(t, keys, len(winners), "keys won")
	require.Equal(t, keys, rows)
	require.Equal(t, keys, distinct)
}

// quoted quotes a schema-qualified table name.
func quoted(table string) string {
	return `"` + strings.ReplaceAll(table, ".", `"."`) + `"`
}

// partitionedStore returns a store like the one behind the repository
// newPartitioned made on table, for the tests that count or interleave a
// claim's statements: the repository's Claim runs the same ClaimOn, in an
// executor of the caller's transaction. Migrate (a no-op on the table)
// makes it know the partitions the repository's Migrate created, as the
// repository's store does.
func partitionedStore(t *testing.T, db *sql.DB, table string) *sqlstore.PartitionedInbox {
	t.Helper()
	s, err := sqlstore.NewPartitionedInbox(sqlstore.Postgres.With(postgres.Migrations, nil), sqlstore.StdDB(db),
		sqlstore.PartitionConfig{Table: table, Interval: time.Hour, Ahead: 2 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(t.Context()))
	return s
}

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
// statement costs no round trip, and a claim is two statements whether it
// wins or finds a duplicate: the lock, and the insert that returns the
// record it found instead.
func TestPartitionedClaimStatements(t *testing.T) {
	db := testenv.Postgres(t)
	_, table := newPartitioned(t, db)
	store := partitionedStore(t, db, table)
	now := time.Now()
	for _, claimed := range []bool{true, false} {
		tx, err := db.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		ex := &statements{Executor: sqlstore.StdQuerier(tx)}
		c, err := store.ClaimOn(t.Context(), ex, repository.ClaimParams{
			Consumer: "billing", Key: "order-1", PayloadHash: []byte{1}, Now: now, ExpiresAt: now.Add(time.Hour),
		})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		require.Equal(t, claimed, c.Claimed)
		require.Equal(t, 2, ex.n)
	}
}

// after runs hook once, after the first statement whose text contains
// marker has run, before the claim's next statement: the test's handle
// on the interleaving.
type after struct {
	sqlstore.Executor
	marker string
	once   sync.Once
	hook   func()
}

func (e *after) ran(query string) {
	if strings.Contains(query, e.marker) {
		e.once.Do(e.hook)
	}
}

func (e *after) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	n, err := e.Executor.Exec(ctx, query, args...)
	e.ran(query)
	return n, err
}

func (e *after) QueryRow(ctx context.Context, query string, args ...any) sqlstore.Row {
	r := e.Executor.QueryRow(ctx, query, args...) // database/sql runs it here
	e.ran(query)
	return r
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
	claims, err := repo.Claim(t.Context(), tx, params)
	require.NoError(t, err)
	for _, c := range claims {
		require.True(t, c.Claimed)
	}
	require.NoError(t, tx.Commit())
}

// TestPartitionedClaimDuringDetach: cleanup detaches the expired
// partition that holds the key's old record while a claim of the key is
// in progress — the first, committed step of DETACH … CONCURRENTLY, which
// then waits for the claim's transaction. Detached after the claim's
// insert saw the old record, the claim returns that record; detached
// after the claim took its lock, it either claims the key or returns the
// old record (whether a statement still includes a partition being
// detached is PostgreSQL's choice; both are consistent). It never fails.
// (Before, the insert and the read of the record it saw were two
// statements, and the read failed with "inbox record not found" when the
// detach fell between them, or when the INSERT's scan still included the
// partition and the SELECT's did not.)
func TestPartitionedClaimDuringDetach(t *testing.T) {
	for _, tc := range []struct {
		name, after string
		outcomes    []bool // Claimed values allowed
	}{
		{"after the lock", "pg_advisory_xact_lock", []bool{true, false}},
		{"after the insert", "INSERT", []bool{false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := testenv.Postgres(t)
			repo, table := newPartitioned(t, db)
			store := partitionedStore(t, db, table)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			now := time.Now()
			seedOld(t, db, repo, now, "order-1")

			cleaned := make(chan error, 1)
			var deleted int
			ex := &after{marker: tc.after, hook: func() {
				go func() {
					var err error
					deleted, err = repo.DeleteExpired(ctx, now.Add(-time.Hour), 1000)
					cleaned <- err
				}()
				// Wait until the detach has committed its first step, or,
				// when the claim holds no lock on the table yet (after the
				// lock), maybe until it has dropped the partition.
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
						cleaned <- err
						return
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
			c, err := store.ClaimOn(ctx, ex, repository.ClaimParams{
				Consumer: "billing", Key: "order-1", PayloadHash: []byte{1}, Now: now, ExpiresAt: now.Add(time.Hour),
			})
			require.NoError(t, err)
			require.Contains(t, tc.outcomes, c.Claimed)
			if !c.Claimed {
				require.Equal(t, "order-1", c.Existing.Key)
				require.True(t, c.Existing.ExpiresAt.Before(now), "the old record")
			}
			require.NoError(t, tx.Commit())

			require.NoError(t, <-cleaned)
			require.Equal(t, 1, deleted, "cleanup dropped the old record")
			var rows int
			require.NoError(t, db.QueryRowContext(ctx, `SELECT COUNT(*) FROM "`+table+`" WHERE dedup_key = 'order-1'`).Scan(&rows))
			require.Equal(t, map[bool]int{true: 1, false: 0}[c.Claimed], rows, "a claimed key keeps its new record")
		})
	}
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
					c, err := claimTx(ctx, repo, tx, repository.ClaimParams{
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
