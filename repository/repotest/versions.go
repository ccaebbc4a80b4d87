package repotest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

// VersionStore is what a backend's version guard provides to the suite.
type VersionStore interface {
	repository.VersionGuard[*sql.Tx]
	// LastVersion returns the last applied version, or an error wrapping
	// repository.ErrNotFound.
	LastVersion(ctx context.Context, consumer, entity string) (int64, error)
}

// VersionBackend describes a version guard under test.
type VersionBackend struct {
	// Name labels the backend in failure messages.
	Name string
	// DB is the database the cases open transactions on.
	DB *sql.DB
	// New returns a store over a ready (migrated) versions table with the
	// given name, registering its removal with t.Cleanup. It must refuse
	// an invalid table name with an error wrapping
	// repository.ErrInvalidTableName.
	New func(t *testing.T, table string) (VersionStore, error)
}

// RunVersionGuard runs the version guard's conformance cases as parallel
// subtests of t.
func RunVersionGuard(t *testing.T, b VersionBackend) {
	require.NotNil(t, b.New, "VersionBackend.New is required")
	require.NotNil(t, b.DB, "VersionBackend.DB is required")

	newStore := func(t *testing.T) VersionStore {
		t.Helper()
		table := RandomName("versions")
		s, err := b.New(t, table)
		require.NoError(t, err, "%s: New(%q)", b.Name, table)
		return s
	}
	// advance runs one Advance in its own committed transaction.
	advance := func(t *testing.T, s VersionStore, p repository.AdvanceParams) (applied bool) {
		t.Helper()
		ctx := context.Background()
		require.NoError(t, inTx(ctx, b.DB, func(tx *sql.Tx) (err error) {
			applied, err = s.Advance(ctx, tx, p)
			return err
		}), "%s: advance %+v", b.Name, p)
		return applied
	}
	last := func(t *testing.T, s VersionStore, consumer, entity string) int64 {
		t.Helper()
		v, err := s.LastVersion(context.Background(), consumer, entity)
		require.NoError(t, err)
		return v
	}

	t.Run("NewerAppliesOlderAndEqualAreStale", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		_, err := s.LastVersion(t.Context(), "orders", "order-1")
		require.ErrorIs(t, err, repository.ErrNotFound)
		for _, step := range []struct {
			version int64
			applied bool
			last    int64
		}{
			{3, true, 3}, {3, false, 3}, {1, false, 3}, {5, true, 5}, {4, false, 5}, {6, true, 6},
		} {
			got := advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: "order-1", Version: step.version})
			require.Equal(t, step.applied, got, "version %d", step.version)
			require.Equal(t, step.last, last(t, s, "orders", "order-1"))
		}
	})

	t.Run("ExtremeVersions", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "c", Entity: "neg", Version: math.MinInt64 + 1}),
			"the first version of an entity applies, whatever it is")
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "c", Entity: "neg", Version: -1}))
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "c", Entity: "neg", Version: math.MaxInt64}))
		require.False(t, advance(t, s, repository.AdvanceParams{Consumer: "c", Entity: "neg", Version: math.MaxInt64}))
		require.Equal(t, int64(math.MaxInt64), last(t, s, "c", "neg"))
	})

	t.Run("ScopedByConsumerAndEntity", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: "order-1", Version: 5}))
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: "order-2", Version: 1}))
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "audit", Entity: "order-1", Version: 1}))
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: "Order-1", Version: 1}),
			"entities differing in case are distinct")
		require.Equal(t, int64(5), last(t, s, "orders", "order-1"))
		require.Equal(t, int64(1), last(t, s, "audit", "order-1"))
	})

	t.Run("RollbackForgetsTheAdvance", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: "order-1", Version: 1}))
		tx, err := b.DB.BeginTx(ctx, nil)
		require.NoError(t, err)
		applied, err := s.Advance(ctx, tx, repository.AdvanceParams{Consumer: "orders", Entity: "order-1", Version: 7})
		require.NoError(t, err)
		require.True(t, applied)
		require.NoError(t, tx.Rollback())
		require.Equal(t, int64(1), last(t, s, "orders", "order-1"), "a rolled-back advance must leave nothing")
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: "order-1", Version: 7}))

		tx, err = b.DB.BeginTx(ctx, nil)
		require.NoError(t, err)
		applied, err = s.Advance(ctx, tx, repository.AdvanceParams{Consumer: "orders", Entity: "new", Version: 7})
		require.NoError(t, err)
		require.True(t, applied)
		require.NoError(t, tx.Rollback())
		_, err = s.LastVersion(ctx, "orders", "new")
		require.ErrorIs(t, err, repository.ErrNotFound, "a rolled-back first advance must leave no row")
	})

	t.Run("ShuffledWithDuplicatesMatchesInOrder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		const n, copies = 50, 3
		rng := rand.New(rand.NewPCG(1, 2))
		for _, window := range []int{n * copies, 10} {
			deliveries := shuffledVersions(rng, n, copies, window)
			entity := fmt.Sprintf("order-w%d", window)
			var applied, stale int
			var max int64
			wantApplied := 0
			for _, v := range deliveries {
				if v > max {
					max = v
					wantApplied++
				}
				if advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: entity, Version: v}) {
					applied++
				} else {
					stale++
				}
			}
			require.Equal(t, wantApplied, applied, "exactly the deliveries newer than everything before them apply")
			require.Equal(t, n*copies-wantApplied, stale)
			require.Equal(t, int64(n), last(t, s, "orders", entity))
			t.Logf("%s: %d deliveries of versions 1..%d shuffled in windows of %d: %d applied, %d stale",
				b.Name, len(deliveries), n, window, applied, stale)
		}
	})

	t.Run("ConcurrentDeliveriesApplyInVersionOrder", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		const entities, n, copies, workers = 3, 40, 3, 8
		type delivery struct {
			entity  string
			version int64
		}
		var queue []delivery
		rng := rand.New(rand.NewPCG(3, 4))
		for e := range entities {
			for _, v := range shuffledVersions(rng, n, copies, 12) {
				queue = append(queue, delivery{fmt.Sprintf("order-%d", e), v})
			}
		}
		work := make(chan delivery, len(queue))
		for _, d := range queue {
			work <- d
		}
		close(work)

		var (
			mu            sync.Mutex
			lastApplied   = map[string]int64{}
			appliedByVer  = map[delivery]int{}
			violations    []string
			applied       atomic.Int64
			stale         atomic.Int64
			retries       atomic.Int64
			failures      []error
			wg            sync.WaitGroup
			errRetryLater = errors.New("retry")
		)
		try := func(d delivery) error {
			ctx := context.Background()
			var ok bool
			if err := inTx(ctx, b.DB, func(tx *sql.Tx) (err error) {
				ok, err = s.Advance(ctx, tx, repository.AdvanceParams{Consumer: "orders", Entity: d.entity, Version: d.version})
				if err != nil {
					return fmt.Errorf("%w: %w", errRetryLater, err)
				}
				if ok {
					// The entity's row is locked until commit: deliveries of
					// one entity pass here one at a time, in lock order.
					mu.Lock()
					if prev := lastApplied[d.entity]; prev >= d.version {
						violations = append(violations, fmt.Sprintf("%s: applied %d after %d", d.entity, d.version, prev))
					}
					lastApplied[d.entity] = d.version
					appliedByVer[d]++
					mu.Unlock()
				}
				return nil
			}); err != nil {
				return err
			}
			if ok {
				applied.Add(1)
			} else {
				stale.Add(1)
			}
			return nil
		}
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for d := range work {
					for attempt := 0; ; attempt++ {
						err := try(d)
						if err == nil {
							break
						}
						// A redelivery, as the broker would do; bounded.
						if errors.Is(err, errRetryLater) && attempt < 20 {
							retries.Add(1)
							continue
						}
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
						break
					}
				}
			}()
		}
		wg.Wait()
		require.Empty(t, failures)
		require.Empty(t, violations, "versions must be applied in increasing order")
		require.Equal(t, int64(len(queue)), applied.Load()+stale.Load(), "every delivery is applied or stale, once")
		for d, count := range appliedByVer {
			require.Equal(t, 1, count, "%s version %d applied more than once", d.entity, d.version)
		}
		for e := range entities {
			entity := fmt.Sprintf("order-%d", e)
			require.Equal(t, int64(n), last(t, s, "orders", entity))
			require.Equal(t, int64(n), lastApplied[entity])
		}
		t.Logf("%s: %d deliveries over %d workers: %d applied, %d stale, %d retried (deadlock victims)",
			b.Name, len(queue), workers, applied.Load(), stale.Load(), retries.Load())
	})

	t.Run("UnstorableEntitiesAreStoredSafely", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, e := range unstorable {
			p := repository.AdvanceParams{Consumer: "orders", Entity: e.value, Version: 1}
			require.True(t, advance(t, s, p), "%s: first version applies", e.name)
			require.False(t, advance(t, s, p), "%s: the same version again is stale", e.name)
			p.Version = 2
			require.True(t, advance(t, s, p), "%s: a newer version applies", e.name)
			require.Equal(t, int64(2), last(t, s, "orders", e.value), e.name)
		}
		// Long entities sharing a prefix are hashed whole, never truncated.
		prefix := strings.Repeat("e", repository.MaxEntityLength)
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: prefix + "-one", Version: 5}))
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: prefix + "-two", Version: 1}),
			"entities sharing a %d-byte prefix must not collide", repository.MaxEntityLength)
		// The entity with its NUL byte removed is another entity.
		require.True(t, advance(t, s, repository.AdvanceParams{Consumer: "orders", Entity: "order-1", Version: 1}))
	})

	t.Run("InvalidParamsAreRefused", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		ctx := t.Context()
		tx, err := b.DB.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		for name, p := range map[string]repository.AdvanceParams{
			"no consumer": {Entity: "e", Version: 1},
			"no entity":   {Consumer: "c", Version: 1},
			"min version": {Consumer: "c", Entity: "e", Version: math.MinInt64},
		} {
			_, err := s.Advance(ctx, tx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, name)
		}
		for name, consumer := range invalidConsumers {
			_, err := s.Advance(ctx, tx, repository.AdvanceParams{Consumer: consumer, Entity: "e", Version: 1})
			require.ErrorIs(t, err, repository.ErrInvalidParams, name)
		}
	})

	t.Run("InvalidTableNameIsRefused", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{`versions"; DROP TABLE x; --`, "a b", "1abc", "a.b.c"} {
			_, err := b.New(t, name)
			require.ErrorIs(t, err, repository.ErrInvalidTableName, name)
		}
	})
}

// shuffledVersions returns versions 1..n, each copies times, shuffled
// within consecutive windows of the given size (a window of n*copies
// shuffles everything; a small one models a broker that reorders a
// little).
func shuffledVersions(rng *rand.Rand, n, copies, window int) []int64 {
	out := make([]int64, 0, n*copies)
	for v := 1; v <= n; v++ {
		for range copies {
			out = append(out, int64(v))
		}
	}
	for lo := 0; lo < len(out); lo += window {
		w := out[lo:min(lo+window, len(out))]
		rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
	}
	return out
}
