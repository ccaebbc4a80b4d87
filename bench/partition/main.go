// Command partition measures PostgreSQL inbox cleanup two ways on the same
// data: DELETE in janitor batches (repository.DeleteAllExpired on
// postgres.NewRepository) against postgres.NewPartitionedRepository, whose
// DeleteExpired detaches and drops the expired partitions. It reports
// cleanup time, table and index size after cleanup, and the latency of
// concurrent claims through each repository's Claim (BEGIN, claim,
// COMMIT; half fresh keys, half duplicates of live loaded keys) before and
// during cleanup.
//
//	go run ./bench/partition -rows 10000000
//
// It creates its own tables (random suffix) and drops them at the end.
package main

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

var (
	dsn      = flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN")
	rows     = flag.Int("rows", 1_000_000, "rows loaded into each table")
	days     = flag.Int("days", 10, "expiry spread: rows expire over this many days, half of them already expired")
	workers  = flag.Int("claimers", 4, "goroutines claiming fresh keys during the measurement")
	baseline = flag.Duration("baseline", 10*time.Second, "claim measurement before cleanup")
	batch    = flag.Int("batch", janitor.DefaultBatchSize, "DELETE batch size")
	keep     = flag.Bool("keep", false, "keep the tables")
)

const columns = `consumer VARCHAR(255) NOT NULL, dedup_key VARCHAR(255) NOT NULL, state VARCHAR(16) NOT NULL,
	payload_hash BYTEA, result BYTEA, attempts INTEGER NOT NULL DEFAULT 1, lease_owner VARCHAR(255),
	lease_until TIMESTAMPTZ, created_at TIMESTAMPTZ NOT NULL, completed_at TIMESTAMPTZ, expires_at TIMESTAMPTZ NOT NULL`

func main() {
	flag.Parse()
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "partition:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	db, err := sql.Open("pgx", *dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(*workers + 4)
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	plain, parted := "bench_plain_"+suffix, "bench_parted_"+suffix
	if !*keep {
		defer func() {
			_, _ = db.Exec(`DROP TABLE IF EXISTS ` + plain)
			_, _ = db.Exec(`DROP TABLE IF EXISTS ` + parted)
		}()
	}
	day0 := time.Now().UTC().Truncate(24 * time.Hour)
	half := *days / 2

	// Both tables get their keys and indexes after the load (an index
	// build is far cheaper than 10M random B-tree inserts); the plain one
	// ends with the backend's own schema (schema.sql).
	repo, err := postgres.NewRepository(db, postgres.Config{Table: plain})
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+plain+` (`+columns+`)`); err != nil {
		return err
	}
	// The partitioned one: the repository's own table and partitions,
	// daily; DeleteExpired at the oldest expiry creates the partitions
	// from then on (Ahead covers the whole spread), dropping none.
	prepo, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{
		Table: parted, Interval: 24 * time.Hour, Ahead: time.Duration(2*half+10) * 24 * time.Hour,
	})
	if err != nil {
		return err
	}
	if err := prepo.Migrate(ctx); err != nil {
		return err
	}
	if _, err := prepo.DeleteExpired(ctx, day0.AddDate(0, 0, -half-1), 1); err != nil {
		return err
	}
	// Its primary key is rebuilt after the load, like the plain one's.
	if _, err := db.ExecContext(ctx, `ALTER TABLE `+parted+` DROP CONSTRAINT `+parted+`_pkey`); err != nil {
		return err
	}

	// Rows expire from day0-half to day0+half days; expires < day0 is expired.
	load := func(table string) (time.Duration, error) {
		start := time.Now()
		_, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, dedup_key, state, payload_hash, result, attempts, created_at, completed_at, expires_at)
			SELECT 'bench', md5(g::text) || '-' || g, 'completed', sha256(g::text::bytea), NULL, 1,
			       $1::timestamptz - interval '7 days', $1::timestamptz - interval '7 days',
			       $1::timestamptz + ((g %% %d) - %d) * interval '1 day' + (g %% 86400) * interval '1 second'
			FROM generate_series(1, %d) g`, table, *days, half, *rows), day0)
		return time.Since(start), err
	}
	for _, t := range []string{plain, parted} {
		d, err := load(t)
		if err != nil {
			return fmt.Errorf("load %s: %w", t, err)
		}
		fmt.Printf("loaded %d rows into %s in %s\n", *rows, t, d.Round(time.Millisecond))
	}
	start := time.Now()
	for _, ddl := range []string{
		`ALTER TABLE ` + plain + ` ADD PRIMARY KEY (consumer, dedup_key)`,
		`CREATE INDEX ON ` + plain + ` (expires_at)`,
		`ALTER TABLE ` + parted + ` ADD PRIMARY KEY (consumer, dedup_key, expires_at)`,
		`VACUUM ANALYZE ` + plain,
		`VACUUM ANALYZE ` + parted,
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			return fmt.Errorf("%s: %w", ddl, err)
		}
	}
	fmt.Printf("keys, indexes and VACUUM ANALYZE in %s\n", time.Since(start).Round(time.Millisecond))
	var expired int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+plain+` WHERE expires_at < $1`, day0).Scan(&expired); err != nil {
		return err
	}
	fmt.Printf("expired rows per table: %d\n\n", expired)
	report(ctx, db, "before cleanup", plain, parted)

	// DELETE in batches.
	before, during, cleanup, err := measure(ctx, db, repo, func() error {
		n, err := repository.DeleteAllExpired(ctx, repo, day0, *batch)
		if n != expired {
			return fmt.Errorf("deleted %d of %d", n, expired)
		}
		return err
	})
	if err != nil {
		return err
	}
	fmt.Printf("\nDELETE (batches of %d): cleanup %s\n  claims before: %s\n  claims during: %s\n", *batch, cleanup.Round(time.Millisecond), before, during)

	// DETACH CONCURRENTLY + DROP the wholly expired partitions: the
	// partitioned repository's DeleteExpired, counting what it drops.
	before, during, cleanup, err = measure(ctx, db, prepo, func() error {
		n, err := repository.DeleteAllExpired(ctx, prepo, day0, *batch)
		if n != expired {
			return fmt.Errorf("dropped %d of %d", n, expired)
		}
		return err
	})
	if err != nil {
		return err
	}
	fmt.Printf("DROP PARTITION (%d partitions): cleanup %s\n  claims before: %s\n  claims during: %s\n\n", half+1, cleanup.Round(time.Millisecond), before, during)
	report(ctx, db, "after cleanup", plain, parted)
	start = time.Now()
	if _, err := db.ExecContext(ctx, `VACUUM `+plain); err != nil {
		return err
	}
	fmt.Printf("VACUUM %s after the DELETE took %s\n", plain, time.Since(start).Round(time.Millisecond))
	report(ctx, db, "after VACUUM", plain, parted)
	return nil
}

// measure runs claimers on repo for the baseline, then during cleanup:
// each claim is BEGIN, Claim, COMMIT; every other one repeats a live
// loaded key (a duplicate), the rest are fresh.
func measure(ctx context.Context, db *sql.DB, repo repository.Driver[*sql.Tx], cleanup func() error) (before, during samples, took time.Duration, err error) {
	var phase atomic.Int32 // 0 baseline, 1 cleanup, 2 stop
	var mu sync.Mutex
	var wg sync.WaitGroup
	var seq atomic.Int64
	errs := make(chan error, *workers)
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				p := phase.Load()
				if p == 2 {
					return
				}
				i := seq.Add(1)
				now := time.Now()
				params := repository.ClaimParams{Consumer: "claims", Key: fmt.Sprintf("c-%d", i),
					PayloadHash: []byte{0}, Now: now, ExpiresAt: now.Add(7 * 24 * time.Hour)}
				dup := i%2 == 0
				if dup {
					params.Consumer, params.Key, params.PayloadHash = "bench", liveKey(i), nil
				}
				start := time.Now()
				claimed, err := claimOnce(ctx, db, repo, params)
				d := time.Since(start)
				if err == nil && claimed == dup {
					err = fmt.Errorf("claim of %q: claimed %v, want %v", params.Key, claimed, !dup)
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				s := &before
				if p != 0 {
					s = &during
				}
				if dup {
					s.dup = append(s.dup, d)
				} else {
					s.fresh = append(s.fresh, d)
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-time.After(*baseline):
	case err := <-errs:
		phase.Store(2)
		wg.Wait()
		return before, during, 0, err
	}
	phase.Store(1)
	start := time.Now()
	err = cleanup()
	took = time.Since(start)
	phase.Store(2)
	wg.Wait()
	select {
	case e := <-errs:
		err = e
	default:
	}
	return before, during, took, err
}

// samples are claim latencies by kind.
type samples struct{ fresh, dup []time.Duration }

func (s samples) String() string {
	all := append(slices.Clone(s.fresh), s.dup...)
	return fmt.Sprintf("p50 %s p99 %s (n=%d; fresh p99 %s n=%d, duplicate p99 %s n=%d)",
		pct(all, 50), pct(all, 99), len(all), pct(s.fresh, 99), len(s.fresh), pct(s.dup, 99), len(s.dup))
}

// liveKey is a loaded key that expires after day0 (g % days >= half).
func liveKey(i int64) string {
	g := int(i)%(*rows) + 1
	for g%*days < *days/2 {
		g = g%(*rows) + 1
	}
	return fmt.Sprintf("%x-%d", md5.Sum([]byte(strconv.Itoa(g))), g)
}

func claimOnce(ctx context.Context, db *sql.DB, repo repository.Driver[*sql.Tx], p repository.ClaimParams) (bool, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	c, err := repo.Claim(ctx, tx, []repository.ClaimParams{p})
	if err != nil {
		return false, err
	}
	return c[0].Claimed, tx.Commit()
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(10 * time.Microsecond)
}

func report(ctx context.Context, db *sql.DB, when string, tables ...string) {
	for _, t := range tables {
		var heap, idx, rowsLeft int64
		// For a partitioned table, sum over its partitions.
		err := db.QueryRowContext(ctx, `SELECT COALESCE(SUM(pg_relation_size(c.oid)), 0), COALESCE(SUM(pg_indexes_size(c.oid)), 0)
			FROM pg_class c WHERE c.oid = $1::regclass OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = $1::regclass)`, t).Scan(&heap, &idx)
		if err == nil {
			err = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+t).Scan(&rowsLeft)
		}
		if err != nil {
			fmt.Printf("%s: %s: %v\n", when, t, err)
			continue
		}
		fmt.Printf("%-15s %-30s rows %9d  heap %8.1f MiB  indexes %8.1f MiB\n", when, t, rowsLeft, float64(heap)/(1<<20), float64(idx)/(1<<20))
	}
}
