package repotest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
)

// BenchBackend describes a backend for Bench. It mirrors Backend, with a
// New that also accepts a *testing.B.
type BenchBackend struct {
	// Name labels the backend in failure messages.
	Name string
	// DB is the database the transactional benchmarks open transactions
	// on; required with Features.Transactional.
	DB *sql.DB
	// Features declares the implemented contracts: Transactional adds
	// Claim and DuplicateClaim, TwoPhase adds Acquire, DuplicateAcquire
	// and Complete; Cleanup runs unless ExpiryByTTL is set.
	Features Features
	// New returns a repository over a ready (migrated) table with the given
	// name and registers its removal with tb.Cleanup.
	New func(tb testing.TB, table string) (Repository, error)
}

// CleanupBatch is how many expired records one iteration of the Cleanup
// benchmark deletes with a single DeleteExpired call (the janitor's
// default batch size).
const CleanupBatch = 1000

// Bench runs the storage benchmarks that apply to bb as sub-benchmarks of
// b, one operation per iteration on one goroutine, each on a table of its
// own, and reports msgs/s (rows/s for Cleanup) besides ns/op:
//
//   - Claim: begin, Claim of a fresh key, commit — the marker a first
//     delivery costs in transactional mode;
//   - DuplicateClaim: begin, Claim of a stored key (the conflicting
//     insert and the read of the stored record), rollback — a duplicate;
//   - Acquire, DuplicateAcquire: the same for two-phase mode;
//   - Complete: marking an acquired record completed with a result;
//   - Cleanup: one DeleteExpired of CleanupBatch expired records among
//     live ones (the records are seeded with the timer stopped); not
//     with Features.CleanupInterval, whose cleanup drops whole intervals.
//
// Wire it in a backend's tests:
//
//	func BenchmarkRepository(b *testing.B) {
//		db := testenv.Postgres(b)
//		repotest.Bench(b, repotest.BenchBackend{Name: "postgres", DB: db, Features: …, New: …})
//	}
func Bench(b *testing.B, bb BenchBackend) {
	if bb.New == nil {
		b.Fatal("BenchBackend.New is required")
	}
	if bb.Features.Transactional {
		if bb.DB == nil {
			b.Fatal("BenchBackend.DB is required for the transactional benchmarks")
		}
		b.Run("Claim", func(b *testing.B) { benchClaim(b, bb) })
		b.Run("DuplicateClaim", func(b *testing.B) { benchDuplicateClaim(b, bb) })
	}
	if bb.Features.TwoPhase {
		b.Run("Acquire", func(b *testing.B) { benchAcquire(b, bb) })
		b.Run("DuplicateAcquire", func(b *testing.B) { benchDuplicateAcquire(b, bb) })
		b.Run("Complete", func(b *testing.B) { benchComplete(b, bb) })
	}
	if !bb.Features.ExpiryByTTL && bb.Features.CleanupInterval == 0 { // whole intervals: see bench/partition
		b.Run("Cleanup", func(b *testing.B) { benchCleanup(b, bb) })
	}
}

func newBenchFixture(b *testing.B, bb BenchBackend) *fixture {
	b.Helper()
	f, err := openFixture(Backend{Name: bb.Name, DB: bb.DB, Features: bb.Features}, "bench",
		func(table string) (Repository, error) { return bb.New(b, table) })
	if err != nil {
		b.Fatal(err)
	}
	return f
}

// claimTx claims p in a transaction of its own; it commits a fresh claim
// and rolls a duplicate back, as the inbox middleware does.
func (f *fixture) claimTx(ctx context.Context, p repository.ClaimParams) (repository.Claim, error) {
	tx, err := f.b.DB.BeginTx(ctx, nil)
	if err != nil {
		return repository.Claim{}, err
	}
	c, err := claimOne(ctx, f.tx, tx, p)
	if err != nil || !c.Claimed {
		return c, errors.Join(err, tx.Rollback())
	}
	return c, tx.Commit()
}

func benchAcquireParams(key, owner string, now time.Time) repository.AcquireParams {
	return repository.AcquireParams{
		Consumer:    "bench",
		Key:         key,
		PayloadHash: repository.HashPayload([]byte(key)),
		Owner:       owner,
		Now:         now,
		LeaseUntil:  now.Add(time.Minute),
		ExpiresAt:   now.Add(24 * time.Hour),
	}
}

func reportRate(b *testing.B, perOp float64, unit string) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(perOp*float64(b.N)/s, unit)
	}
}

// benchFresh times op on a fresh key per iteration; op reports whether
// it took the key as new.
func benchFresh(b *testing.B, bb BenchBackend, op func(context.Context, *fixture, int) (bool, error)) {
	f := newBenchFixture(b, bb)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		fresh, err := op(ctx, f, i)
		if err != nil {
			b.Fatal(err)
		}
		if !fresh {
			b.Fatalf("fresh key %d reported as taken", i)
		}
	}
	reportRate(b, 1, "msgs/s")
}

func benchClaim(b *testing.B, bb BenchBackend) {
	benchFresh(b, bb, func(ctx context.Context, f *fixture, i int) (bool, error) {
		c, err := f.claimTx(ctx, ClaimParams("bench", fmt.Sprintf("claim-%d", i)))
		return c.Claimed, err
	})
}

func benchDuplicateClaim(b *testing.B, bb BenchBackend) {
	f := newBenchFixture(b, bb)
	ctx := context.Background()
	p := ClaimParams("bench", "duplicate")
	if _, err := f.claimTx(ctx, p); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		c, err := f.claimTx(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		if c.Claimed {
			b.Fatal("a stored key was claimed again")
		}
	}
	reportRate(b, 1, "msgs/s")
}

func benchAcquire(b *testing.B, bb BenchBackend) {
	benchFresh(b, bb, func(ctx context.Context, f *fixture, i int) (bool, error) {
		a, err := f.tp.Acquire(ctx, benchAcquireParams(fmt.Sprintf("acquire-%d", i), "owner", time.Now()))
		return a.Acquired, err
	})
}

func benchDuplicateAcquire(b *testing.B, bb BenchBackend) {
	f := newBenchFixture(b, bb)
	ctx := context.Background()
	now := time.Now()
	if _, err := f.tp.Acquire(ctx, benchAcquireParams("duplicate", "first", now)); err != nil {
		b.Fatal(err)
	}
	if err := f.tp.Complete(ctx, repository.CompleteParams{Consumer: "bench", Key: "duplicate", Owner: "first", Result: []byte("result"), Now: now}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		a, err := f.tp.Acquire(ctx, benchAcquireParams("duplicate", "second", time.Now()))
		if err != nil {
			b.Fatal(err)
		}
		if a.Acquired || a.Existing.State != repository.StateCompleted {
			b.Fatalf("a completed key was acquired again or is not completed: %+v", a)
		}
	}
	reportRate(b, 1, "msgs/s")
}

// benchComplete times Complete alone: keys are acquired in chunks with the
// timer stopped.
func benchComplete(b *testing.B, bb BenchBackend) {
	const chunk = 1000
	f := newBenchFixture(b, bb)
	ctx := context.Background()
	result := []byte("result")
	var pending []string
	for i := 0; b.Loop(); i++ {
		if len(pending) == 0 {
			b.StopTimer()
			now := time.Now()
			for j := range chunk {
				key := fmt.Sprintf("complete-%d", i+j)
				if _, err := f.tp.Acquire(ctx, benchAcquireParams(key, "owner", now)); err != nil {
					b.Fatal(err)
				}
				pending = append(pending, key)
			}
			b.StartTimer()
		}
		key := pending[0]
		pending = pending[1:]
		if err := f.tp.Complete(ctx, repository.CompleteParams{Consumer: "bench", Key: key, Owner: "owner", Result: result, Now: time.Now()}); err != nil {
			b.Fatal(err)
		}
	}
	reportRate(b, 1, "msgs/s")
}

// benchCleanup times DeleteExpired of CleanupBatch expired records per
// iteration, in a table that also holds live records (which must stay).
// The expired records are seeded through the contract with the timer
// stopped, so the benchmark's wall time is mostly seeding.
func benchCleanup(b *testing.B, bb BenchBackend) {
	f := newBenchFixture(b, bb)
	ctx := context.Background()
	if err := f.seed(ctx, "live", CleanupBatch, time.Now(), 24*time.Hour); err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		if err := f.seed(ctx, fmt.Sprintf("expired-%d", i), CleanupBatch, time.Now().Add(-2*time.Hour), time.Hour); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		n, err := f.repo.DeleteExpired(ctx, time.Now(), CleanupBatch)
		if err != nil {
			b.Fatal(err)
		}
		if n != CleanupBatch {
			b.Fatalf("DeleteExpired removed %d records, want %d", n, CleanupBatch)
		}
	}
	reportRate(b, CleanupBatch, "rows/s")
}

// seed stores n records under keys prefix-0 … created at createdAt and
// expiring ttl later: claims in one transaction on a transactional
// backend, acquisitions otherwise.
func (f *fixture) seed(ctx context.Context, prefix string, n int, createdAt time.Time, ttl time.Duration) error {
	if f.tx == nil {
		for i := range n {
			p := benchAcquireParams(fmt.Sprintf("%s-%d", prefix, i), "seed", createdAt)
			p.LeaseUntil = createdAt.Add(ttl / 2)
			p.ExpiresAt = createdAt.Add(ttl)
			if _, err := f.tp.Acquire(ctx, p); err != nil {
				return err
			}
		}
		return nil
	}
	tx, err := f.b.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := claimOne(ctx, f.tx, tx, repository.ClaimParams{
			Consumer: "bench", Key: key, PayloadHash: repository.HashPayload([]byte(key)),
			Now: createdAt, ExpiresAt: createdAt.Add(ttl),
		}); err != nil {
			return errors.Join(err, tx.Rollback())
		}
	}
	return tx.Commit()
}
