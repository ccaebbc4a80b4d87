package repotest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

// leaseLength is the lease the two-phase cases take. Expiry is simulated by
// passing a later Now, never by waiting.
const leaseLength = time.Minute

func runTwoPhase(t *testing.T, b Backend) {
	runCase(t, b, "FreshAcquire", func(t *testing.T, f *fixture) {
		p := acquireParams("billing", "order-1", "owner-a")

		a := f.acquire(t, p)
		require.True(t, a.Acquired)
		require.Zero(t, a.Existing)

		rec := f.get(t, "billing", "order-1")
		requireFirstRecord(t, repository.ClaimParams{
			Consumer: p.Consumer, Key: p.Key, PayloadHash: p.PayloadHash, Now: p.Now, ExpiresAt: p.ExpiresAt,
		}, rec)
		require.Equal(t, repository.StateInProgress, rec.State)
		require.Equal(t, "owner-a", rec.LeaseOwner)
		requireTime(t, p.LeaseUntil, rec.LeaseUntil, "LeaseUntil")
		require.True(t, rec.CompletedAt.IsZero(), "CompletedAt %s, want zero before completion", rec.CompletedAt)
	})

	runCase(t, b, "AcquireOfCompletedIsDuplicate", func(t *testing.T, f *fixture) {
		first := acquireParams("billing", "order-1", "owner-a")
		first.PayloadHash = repository.HashPayload([]byte{0, 1, 2, 0xff})
		require.True(t, f.acquire(t, first).Acquired)
		result := []byte{0, 0xff, 0xfe, '\n', 0, 'x'}
		completedAt := first.Now.Add(time.Second)
		require.NoError(t, f.tp.Complete(t.Context(), repository.CompleteParams{
			Consumer: "billing", Key: "order-1", Owner: "owner-a", Result: result, Now: completedAt,
		}))

		second := acquireParams("billing", "order-1", "owner-b")
		second.Now = first.LeaseUntil.Add(time.Hour) // long after the lease: completion is final
		second.LeaseUntil = second.Now.Add(leaseLength)
		second.PayloadHash = repository.HashPayload([]byte("other content"))
		a := f.acquire(t, second)
		require.False(t, a.Acquired)
		require.Equal(t, repository.StateCompleted, a.Existing.State)
		require.Equal(t, first.PayloadHash, a.Existing.PayloadHash, "the duplicate must see the first acquire's hash")
		require.Equal(t, result, a.Existing.Result)
		require.Equal(t, "order-1", a.Existing.Key)
		require.Equal(t, 1, a.Existing.Attempts)
		require.Equal(t, "owner-a", a.Existing.LeaseOwner, "a completed record keeps the owner that completed it")
		requireTime(t, completedAt, a.Existing.CompletedAt, "CompletedAt")
		requireTime(t, first.Now, a.Existing.CreatedAt, "CreatedAt")
	})

	runCase(t, b, "LiveLeaseIsBusy", func(t *testing.T, f *fixture) {
		first := f.acquired(t, "billing", "order-1", "owner-a")

		second := acquireParams("billing", "order-1", "owner-b")
		second.Now = first.LeaseUntil.Add(-time.Microsecond)
		second.LeaseUntil = second.Now.Add(leaseLength)
		a := f.acquire(t, second)
		require.False(t, a.Acquired)
		require.Equal(t, repository.StateInProgress, a.Existing.State)
		require.Equal(t, "owner-a", a.Existing.LeaseOwner)
		require.True(t, a.Existing.LeaseUntil.After(second.Now), "a live lease is busy: LeaseUntil %s must be after Now %s", a.Existing.LeaseUntil, second.Now)
		require.Equal(t, "owner-a", f.get(t, "billing", "order-1").LeaseOwner, "a busy acquire must not change the record")
	})

	runCase(t, b, "ExpiredLeaseIsStale", func(t *testing.T, f *fixture) {
		first := f.acquired(t, "billing", "order-1", "owner-a")

		for _, now := range []time.Time{first.LeaseUntil, first.LeaseUntil.Add(time.Hour)} {
			second := acquireParams("billing", "order-1", "owner-b")
			second.Now, second.LeaseUntil = now, now.Add(leaseLength)
			a := f.acquire(t, second)
			require.False(t, a.Acquired, "an expired lease is not silently taken over")
			require.Equal(t, repository.StateInProgress, a.Existing.State)
			require.Equal(t, "owner-a", a.Existing.LeaseOwner)
			require.False(t, a.Existing.LeaseUntil.After(now), "an expired lease is stale: LeaseUntil %s must not be after Now %s", a.Existing.LeaseUntil, now)
		}
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, "owner-a", rec.LeaseOwner)
		require.Equal(t, 1, rec.Attempts)
	})

	runCase(t, b, "CompleteStoresResultThenDuplicate", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		done := p.Now.Add(time.Second)
		require.NoError(t, f.tp.Complete(ctx, repository.CompleteParams{
			Consumer: "billing", Key: "order-1", Owner: "owner-a", Result: []byte("result-1"), Now: done,
		}))

		rec := f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Equal(t, []byte("result-1"), rec.Result)
		require.Equal(t, p.PayloadHash, rec.PayloadHash)
		requireTime(t, done, rec.CompletedAt, "CompletedAt")
		requireTime(t, p.ExpiresAt, rec.ExpiresAt, "ExpiresAt")

		again := acquireParams("billing", "order-1", "owner-b")
		a := f.acquire(t, again)
		require.False(t, a.Acquired)
		require.Equal(t, repository.StateCompleted, a.Existing.State)
		require.Equal(t, []byte("result-1"), a.Existing.Result)

		// A completed record is final: even its owner cannot change it.
		lease := repository.LeaseParams{Consumer: "billing", Key: "order-1", Owner: "owner-a", LeaseUntil: p.LeaseUntil.Add(time.Hour)}
		require.ErrorIs(t, f.tp.Complete(ctx, repository.CompleteParams{
			Consumer: "billing", Key: "order-1", Owner: "owner-a", Result: []byte("again"), Now: done,
		}), repository.ErrLeaseLost)
		require.ErrorIs(t, f.tp.Extend(ctx, lease), repository.ErrLeaseLost)
		require.ErrorIs(t, f.tp.Release(ctx, lease), repository.ErrLeaseLost)
		_, err := f.tp.Reclaim(ctx, repository.ReclaimParams{
			Consumer: "billing", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-c",
			Now: p.LeaseUntil.Add(time.Hour), LeaseUntil: p.LeaseUntil.Add(2 * time.Hour),
		})
		require.ErrorIs(t, err, repository.ErrLeaseLost)
		rec = f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Equal(t, []byte("result-1"), rec.Result)
	})

	runCase(t, b, "CompleteWithoutResultStoresNil", func(t *testing.T, f *fixture) {
		p := f.acquired(t, "billing", "order-1", "owner-a")
		require.NoError(t, f.tp.Complete(t.Context(), repository.CompleteParams{
			Consumer: "billing", Key: "order-1", Owner: "owner-a", Now: p.Now,
		}))
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Nil(t, rec.Result)
	})

	runCase(t, b, "ReleaseDeletesSoNextAcquireWins", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		f.acquired(t, "billing", "order-1", "owner-a")
		require.NoError(t, f.tp.Release(ctx, repository.LeaseParams{Consumer: "billing", Key: "order-1", Owner: "owner-a"}))

		_, err := f.repo.Get(ctx, "billing", "order-1")
		require.ErrorIs(t, err, repository.ErrNotFound)

		next := acquireParams("billing", "order-1", "owner-b")
		require.True(t, f.acquire(t, next).Acquired, "the acquire after a release must win")
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, "owner-b", rec.LeaseOwner)
		require.Equal(t, 1, rec.Attempts)

		require.ErrorIs(t, f.tp.Release(ctx, repository.LeaseParams{Consumer: "billing", Key: "order-1", Owner: "owner-a"}),
			repository.ErrLeaseLost, "a second release by the old owner must not delete the new claim")
		require.Equal(t, "owner-b", f.get(t, "billing", "order-1").LeaseOwner)
	})

	runCase(t, b, "ExtendMovesDeadline", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		extended := p.LeaseUntil.Add(10 * time.Minute)
		require.NoError(t, f.tp.Extend(ctx, repository.LeaseParams{Consumer: "billing", Key: "order-1", Owner: "owner-a", LeaseUntil: extended}))

		rec := f.get(t, "billing", "order-1")
		requireTime(t, extended, rec.LeaseUntil, "LeaseUntil")
		require.Equal(t, "owner-a", rec.LeaseOwner)
		require.Equal(t, 1, rec.Attempts)

		// Past the original deadline the lease is still live.
		later := p.LeaseUntil.Add(time.Minute)
		other := acquireParams("billing", "order-1", "owner-b")
		other.Now, other.LeaseUntil = later, later.Add(leaseLength)
		a := f.acquire(t, other)
		require.False(t, a.Acquired)
		require.True(t, a.Existing.LeaseUntil.After(later), "the extended lease must be busy at %s", later)
		_, err := f.tp.Reclaim(ctx, repository.ReclaimParams{
			Consumer: "billing", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-b",
			Now: later, LeaseUntil: later.Add(leaseLength),
		})
		require.ErrorIs(t, err, repository.ErrLeaseLost, "an extended lease cannot be reclaimed before its new deadline")

		// The owner can still complete after extending.
		require.NoError(t, f.tp.Complete(ctx, repository.CompleteParams{Consumer: "billing", Key: "order-1", Owner: "owner-a", Now: later}))
	})

	runCase(t, b, "ReclaimTakesOverExpiredLease", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")

		// The lease is expired at its deadline (LeaseUntil not after Now).
		now := p.LeaseUntil
		rp := repository.ReclaimParams{
			Consumer: "billing", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-b",
			Now: now, LeaseUntil: now.Add(leaseLength),
		}
		rec, err := f.tp.Reclaim(ctx, rp)
		require.NoError(t, err)
		for _, rec := range []repository.Record{rec, f.get(t, "billing", "order-1")} {
			require.Equal(t, repository.StateInProgress, rec.State)
			require.Equal(t, "owner-b", rec.LeaseOwner)
			requireTime(t, rp.LeaseUntil, rec.LeaseUntil, "LeaseUntil")
			require.Equal(t, 2, rec.Attempts)
			require.Equal(t, p.PayloadHash, rec.PayloadHash)
			require.Equal(t, "order-1", rec.Key)
			requireTime(t, p.Now, rec.CreatedAt, "CreatedAt")
			requireTime(t, p.ExpiresAt, rec.ExpiresAt, "ExpiresAt")
		}

		require.NoError(t, f.tp.Complete(ctx, repository.CompleteParams{
			Consumer: "billing", Key: "order-1", Owner: "owner-b", Result: []byte("by-b"), Now: now.Add(time.Second),
		}))
		got := f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateCompleted, got.State)
		require.Equal(t, []byte("by-b"), got.Result)
	})

	runCase(t, b, "ReclaimRefusedUnlessPrevOwnerHoldsExpiredLease", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		expired := p.LeaseUntil.Add(time.Second)

		for name, rp := range map[string]repository.ReclaimParams{
			"live lease": {
				Consumer: "billing", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-b",
				Now: p.LeaseUntil.Add(-time.Microsecond), LeaseUntil: p.LeaseUntil.Add(leaseLength),
			},
			"wrong previous owner": {
				Consumer: "billing", Key: "order-1", PrevOwner: "owner-x", Owner: "owner-b",
				Now: expired, LeaseUntil: expired.Add(leaseLength),
			},
			"missing record": {
				Consumer: "billing", Key: "order-2", PrevOwner: "owner-a", Owner: "owner-b",
				Now: expired, LeaseUntil: expired.Add(leaseLength),
			},
			"other consumer": {
				Consumer: "shipping", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-b",
				Now: expired, LeaseUntil: expired.Add(leaseLength),
			},
		} {
			_, err := f.tp.Reclaim(ctx, rp)
			require.ErrorIs(t, err, repository.ErrLeaseLost, name)
		}
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, "owner-a", rec.LeaseOwner)
		require.Equal(t, 1, rec.Attempts)
		requireTime(t, p.LeaseUntil, rec.LeaseUntil, "LeaseUntil")
	})

	runCase(t, b, "StaleOwnerIsFenced", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		now := p.LeaseUntil.Add(time.Second)
		newLease := now.Add(leaseLength)
		_, err := f.tp.Reclaim(ctx, repository.ReclaimParams{
			Consumer: "billing", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-b", Now: now, LeaseUntil: newLease,
		})
		require.NoError(t, err)

		// owner-a outlived its lease and comes back.
		stale := repository.LeaseParams{Consumer: "billing", Key: "order-1", Owner: "owner-a", LeaseUntil: newLease.Add(time.Hour)}
		require.ErrorIs(t, f.tp.Extend(ctx, stale), repository.ErrLeaseLost)
		require.ErrorIs(t, f.tp.Complete(ctx, repository.CompleteParams{
			Consumer: "billing", Key: "order-1", Owner: "owner-a", Result: []byte("stale"), Now: now,
		}), repository.ErrLeaseLost)
		require.ErrorIs(t, f.tp.Release(ctx, stale), repository.ErrLeaseLost)

		rec := f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateInProgress, rec.State, "the stale owner must not change the state")
		require.Equal(t, "owner-b", rec.LeaseOwner)
		requireTime(t, newLease, rec.LeaseUntil, "LeaseUntil")
		require.Nil(t, rec.Result)
		require.Equal(t, 2, rec.Attempts)

		require.NoError(t, f.tp.Complete(ctx, repository.CompleteParams{
			Consumer: "billing", Key: "order-1", Owner: "owner-b", Result: []byte("fresh"), Now: now,
		}))
		require.Equal(t, []byte("fresh"), f.get(t, "billing", "order-1").Result)
	})

	runCase(t, b, "LeaseOperationsOnMissingRecordAreLeaseLost", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		lease := repository.LeaseParams{Consumer: "billing", Key: "never-acquired", Owner: "owner-a", LeaseUntil: time.Now().Add(time.Hour)}
		require.ErrorIs(t, f.tp.Extend(ctx, lease), repository.ErrLeaseLost)
		require.ErrorIs(t, f.tp.Release(ctx, lease), repository.ErrLeaseLost)
		require.ErrorIs(t, f.tp.Complete(ctx, repository.CompleteParams{
			Consumer: "billing", Key: "never-acquired", Owner: "owner-a", Now: time.Now(),
		}), repository.ErrLeaseLost)
		_, err := f.repo.Get(ctx, "billing", "never-acquired")
		require.ErrorIs(t, err, repository.ErrNotFound, "a refused complete must not create a record")
	})

	runCase(t, b, "SameKeyUnderTwoConsumersIsTwoRecords", func(t *testing.T, f *fixture) {
		require.True(t, f.acquire(t, acquireParams("billing", "order-1", "owner-a")).Acquired)
		require.True(t, f.acquire(t, acquireParams("shipping", "order-1", "owner-b")).Acquired)
		require.NoError(t, f.tp.Release(t.Context(), repository.LeaseParams{Consumer: "billing", Key: "order-1", Owner: "owner-a"}))
		require.Equal(t, "owner-b", f.get(t, "shipping", "order-1").LeaseOwner)
	})

	runCase(t, b, "ConcurrentAcquiresOneOwner", func(t *testing.T, f *fixture) {
		ctx := context.Background()
		base := acquireParams("billing", "order-1", "unused")

		var (
			winners atomic.Int32
			results = make([]repository.Acquisition, Racers)
		)
		failures := race(Racers, func(i int) (err error) {
			p := base
			p.Owner = fmt.Sprintf("owner-%d", i)
			// Expiries days apart, as redeliveries compute them:
			// they must not take part in deciding the race.
			p.ExpiresAt = p.Now.Add(24*time.Hour + time.Duration(i%4)*25*time.Hour)
			results[i], err = f.tp.Acquire(ctx, p)
			if err == nil && results[i].Acquired {
				winners.Add(1)
			}
			return err
		})

		for i, err := range failures {
			require.NoError(t, err, "racer %d", i)
		}
		require.EqualValues(t, 1, winners.Load(), "exactly one racer must acquire the key")
		var winner string
		for i, a := range results {
			if a.Acquired {
				winner = fmt.Sprintf("owner-%d", i)
			}
		}
		for i, a := range results {
			if a.Acquired {
				continue
			}
			require.Equal(t, repository.StateInProgress, a.Existing.State, "racer %d", i)
			require.Equal(t, winner, a.Existing.LeaseOwner, "racer %d must see the winner's lease", i)
		}
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, winner, rec.LeaseOwner)
		require.Equal(t, 1, rec.Attempts)
	})

	runCase(t, b, "ConcurrentReclaimsOneWinner", func(t *testing.T, f *fixture) {
		ctx := context.Background()
		p := f.acquired(t, "billing", "order-1", "owner-crashed")
		now := p.LeaseUntil.Add(time.Second)

		records := make([]repository.Record, Racers)
		failures := race(Racers, func(i int) (err error) {
			records[i], err = f.tp.Reclaim(ctx, repository.ReclaimParams{
				Consumer: "billing", Key: "order-1", PrevOwner: "owner-crashed",
				Owner: fmt.Sprintf("owner-%d", i), Now: now, LeaseUntil: now.Add(leaseLength),
			})
			return err
		})

		winner := -1
		for i, err := range failures {
			if err == nil {
				require.Equal(t, -1, winner, "racers %d and %d both reclaimed", winner, i)
				winner = i
				continue
			}
			require.ErrorIs(t, err, repository.ErrLeaseLost, "racer %d", i)
		}
		require.NotEqual(t, -1, winner, "one racer must reclaim the expired lease")
		owner := fmt.Sprintf("owner-%d", winner)
		require.Equal(t, owner, records[winner].LeaseOwner)
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, owner, rec.LeaseOwner)
		require.Equal(t, 2, rec.Attempts, "attempts must be incremented exactly once")
	})

	runCase(t, b, "AcquireReleaseChurnKeepsOneHolder", func(t *testing.T, f *fixture) {
		// Acquires race with releases of the same key, so an Acquire can
		// collide with a record that is gone before it reads it; it must
		// neither fail nor let two holders in.
		ctx := context.Background()
		const workers, rounds = 8, 40

		var inside, overlaps, acquired atomic.Int32
		failures := race(workers, func(w int) error {
			for i := range rounds {
				p := acquireParams("billing", "order-1", fmt.Sprintf("owner-%d-%d", w, i))
				a, err := f.tp.Acquire(ctx, p)
				if err != nil {
					return err
				}
				if !a.Acquired {
					continue
				}
				acquired.Add(1)
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				inside.Add(-1)
				if err := f.tp.Release(ctx, repository.LeaseParams{Consumer: p.Consumer, Key: p.Key, Owner: p.Owner}); err != nil {
					return err
				}
			}
			return nil
		})

		for w, err := range failures {
			require.NoError(t, err, "worker %d", w)
		}
		require.Zero(t, overlaps.Load(), "two owners held the key at once")
		require.Positive(t, acquired.Load())
		_, err := f.repo.Get(ctx, "billing", "order-1")
		require.ErrorIs(t, err, repository.ErrNotFound, "every holder released")
	})

	runCase(t, b, "LongKeyIsHashedNotTruncated", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		prefix := strings.Repeat("k", repository.MaxKeyLength)
		long1, long2 := prefix+"-one", prefix+"-two"
		huge := strings.Repeat("x", 10_000)

		for _, key := range []string{long1, long2, huge} {
			require.True(t, f.acquire(t, acquireParams("billing", key, "owner-a")).Acquired,
				"long keys sharing a %d-byte prefix must not collide", repository.MaxKeyLength)
		}
		rec := f.get(t, "billing", long2)
		require.Equal(t, repository.StorageKey(long2), rec.Key)
		require.LessOrEqual(t, len(rec.Key), repository.MaxKeyLength)

		require.NoError(t, f.tp.Complete(ctx, repository.CompleteParams{Consumer: "billing", Key: long1, Owner: "owner-a", Result: []byte("one"), Now: time.Now()}))
		require.NoError(t, f.tp.Release(ctx, repository.LeaseParams{Consumer: "billing", Key: long2, Owner: "owner-a"}))
		a := f.acquire(t, acquireParams("billing", long1, "owner-b"))
		require.False(t, a.Acquired, "the same long key again is a duplicate")
		require.Equal(t, []byte("one"), a.Existing.Result)
		require.True(t, f.acquire(t, acquireParams("billing", long2, "owner-b")).Acquired, "a released long key can be acquired again")
		// A short key spelled like a hashed one cannot collide with it.
		require.True(t, f.acquire(t, acquireParams("billing", repository.StorageKey(long1), "owner-a")).Acquired)
	})

	runCase(t, b, "UnstorableKeysAreStoredSafely", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		for _, k := range unstorable {
			require.True(t, f.acquire(t, acquireParams("billing", k.value, "owner-a")).Acquired, k.name)
			requireStoredForm(t, k.value, f.get(t, "billing", k.value).Key)
			require.NoError(t, f.tp.Extend(ctx, repository.LeaseParams{Consumer: "billing", Key: k.value, Owner: "owner-a", LeaseUntil: time.Now().Add(time.Minute)}), k.name)
			require.NoError(t, f.tp.Complete(ctx, repository.CompleteParams{Consumer: "billing", Key: k.value, Owner: "owner-a", Result: []byte(k.name), Now: time.Now()}), k.name)

			again := f.acquire(t, acquireParams("billing", k.value, "owner-b"))
			require.False(t, again.Acquired, "%s: the redelivery is a duplicate", k.name)
			require.Equal(t, repository.StateCompleted, again.Existing.State, k.name)
			require.Equal(t, []byte(k.name), again.Existing.Result, k.name)
		}
		// A released unstorable key can be acquired again.
		k := unstorable[0].value
		require.True(t, f.acquire(t, acquireParams("other", k, "owner-a")).Acquired)
		require.NoError(t, f.tp.Release(ctx, repository.LeaseParams{Consumer: "other", Key: k, Owner: "owner-a"}))
		require.True(t, f.acquire(t, acquireParams("other", k, "owner-b")).Acquired)
	})

	runCase(t, b, "InvalidParamsAreRefused", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		longOwner := strings.Repeat("o", repository.MaxOwnerLength+1)

		valid := acquireParams("billing", "k", "owner-a")
		for name, mutate := range map[string]func(*repository.AcquireParams){
			"empty key":                   func(p *repository.AcquireParams) { p.Key = "" },
			"empty consumer":              func(p *repository.AcquireParams) { p.Consumer = "" },
			"empty owner":                 func(p *repository.AcquireParams) { p.Owner = "" },
			"long owner":                  func(p *repository.AcquireParams) { p.Owner = longOwner },
			"zero now":                    func(p *repository.AcquireParams) { p.Now = time.Time{} },
			"lease not after now":         func(p *repository.AcquireParams) { p.LeaseUntil = p.Now },
			"expiry not after lease":      func(p *repository.AcquireParams) { p.ExpiresAt = p.LeaseUntil },
			"expiry before now and lease": func(p *repository.AcquireParams) { p.ExpiresAt = p.Now.Add(-time.Second) },
		} {
			p := valid
			mutate(&p)
			_, err := f.tp.Acquire(ctx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, "acquire: %s", name)
		}
		for name, consumer := range invalidConsumers {
			p := valid
			p.Consumer = consumer
			_, err := f.tp.Acquire(ctx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, "acquire: %s", name)
			lease := repository.LeaseParams{Consumer: consumer, Key: "k", Owner: "owner-a", LeaseUntil: valid.LeaseUntil}
			require.ErrorIs(t, f.tp.Extend(ctx, lease), repository.ErrInvalidParams, "extend: %s", name)
			require.ErrorIs(t, f.tp.Release(ctx, lease), repository.ErrInvalidParams, "release: %s", name)
			require.ErrorIs(t, f.tp.Complete(ctx, repository.CompleteParams{Consumer: consumer, Key: "k", Owner: "owner-a", Now: valid.Now}),
				repository.ErrInvalidParams, "complete: %s", name)
		}
		for name, owner := range map[string]string{"owner with NUL": "own\x00er", "owner with invalid UTF-8": "own\xffer"} {
			p := valid
			p.Owner = owner
			_, err := f.tp.Acquire(ctx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, "acquire: %s", name)
		}

		validReclaim := repository.ReclaimParams{
			Consumer: "billing", Key: "k", PrevOwner: "owner-a", Owner: "owner-b",
			Now: valid.Now, LeaseUntil: valid.LeaseUntil,
		}
		for name, mutate := range map[string]func(*repository.ReclaimParams){
			"empty key":            func(p *repository.ReclaimParams) { p.Key = "" },
			"empty consumer":       func(p *repository.ReclaimParams) { p.Consumer = "" },
			"empty previous owner": func(p *repository.ReclaimParams) { p.PrevOwner = "" },
			"empty owner":          func(p *repository.ReclaimParams) { p.Owner = "" },
			"same owner":           func(p *repository.ReclaimParams) { p.Owner = p.PrevOwner },
			"zero now":             func(p *repository.ReclaimParams) { p.Now = time.Time{} },
			"lease not after now":  func(p *repository.ReclaimParams) { p.LeaseUntil = p.Now.Add(-time.Second) },
		} {
			p := validReclaim
			mutate(&p)
			_, err := f.tp.Reclaim(ctx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, "reclaim: %s", name)
		}

		validLease := repository.LeaseParams{Consumer: "billing", Key: "k", Owner: "owner-a", LeaseUntil: valid.LeaseUntil}
		for name, mutate := range map[string]func(*repository.LeaseParams){
			"empty key":      func(p *repository.LeaseParams) { p.Key = "" },
			"empty consumer": func(p *repository.LeaseParams) { p.Consumer = "" },
			"empty owner":    func(p *repository.LeaseParams) { p.Owner = "" },
		} {
			p := validLease
			mutate(&p)
			require.ErrorIs(t, f.tp.Extend(ctx, p), repository.ErrInvalidParams, "extend: %s", name)
			require.ErrorIs(t, f.tp.Release(ctx, p), repository.ErrInvalidParams, "release: %s", name)
		}
		noDeadline := validLease
		noDeadline.LeaseUntil = time.Time{}
		require.ErrorIs(t, f.tp.Extend(ctx, noDeadline), repository.ErrInvalidParams, "extend: zero LeaseUntil")

		validComplete := repository.CompleteParams{Consumer: "billing", Key: "k", Owner: "owner-a", Now: valid.Now}
		for name, mutate := range map[string]func(*repository.CompleteParams){
			"empty key":      func(p *repository.CompleteParams) { p.Key = "" },
			"empty consumer": func(p *repository.CompleteParams) { p.Consumer = "" },
			"empty owner":    func(p *repository.CompleteParams) { p.Owner = "" },
			"zero now":       func(p *repository.CompleteParams) { p.Now = time.Time{} },
		} {
			p := validComplete
			mutate(&p)
			require.ErrorIs(t, f.tp.Complete(ctx, p), repository.ErrInvalidParams, "complete: %s", name)
		}

		_, err := f.repo.Get(ctx, "billing", "k")
		require.ErrorIs(t, err, repository.ErrNotFound, "refused calls must store nothing")
	})
}

// acquire calls Acquire and requires it to succeed.
func (f *fixture) acquire(t *testing.T, p repository.AcquireParams) repository.Acquisition {
	t.Helper()
	a, err := f.tp.Acquire(context.Background(), p)
	require.NoError(t, err, "%s: acquire %q/%q by %q", f.b.Name, p.Consumer, p.Key, p.Owner)
	return a
}

// acquired acquires key for owner with acquireParams, requires a fresh
// acquisition and returns the params it used.
func (f *fixture) acquired(t *testing.T, consumer, key, owner string) repository.AcquireParams {
	t.Helper()
	p := acquireParams(consumer, key, owner)
	require.True(t, f.acquire(t, p).Acquired, "%s: acquire %q/%q by %q must be fresh", f.b.Name, consumer, key, owner)
	return p
}

// get reads a record and requires it to exist.
func (f *fixture) get(t *testing.T, consumer, key string) repository.Record {
	t.Helper()
	rec, err := f.repo.Get(context.Background(), consumer, key)
	require.NoError(t, err, "%s: get %q/%q", f.b.Name, consumer, key)
	return rec
}

// seedCompleted stores a completed record created at now and expiring at
// expiresAt, through whichever claim contract the backend implements.
func (f *fixture) seedCompleted(t *testing.T, consumer, key string, now, expiresAt time.Time) {
	t.Helper()
	if f.tx != nil {
		f.claim(t, repository.ClaimParams{
			Consumer: consumer, Key: key, PayloadHash: repository.HashPayload([]byte(key)),
			Now: now, ExpiresAt: expiresAt,
		}, nil)
		return
	}
	ctx := context.Background()
	a, err := f.tp.Acquire(ctx, repository.AcquireParams{
		Consumer: consumer, Key: key, PayloadHash: repository.HashPayload([]byte(key)),
		Owner: "seed", Now: now, LeaseUntil: now.Add(time.Second), ExpiresAt: expiresAt,
	})
	require.NoError(t, err)
	require.True(t, a.Acquired, "seed %q must be fresh", key)
	err = f.tp.Complete(ctx, repository.CompleteParams{Consumer: consumer, Key: key, Owner: "seed", Now: now})
	if f.b.Features.ExpiryByTTL && expiresAt.Before(time.Now()) {
		// The store may already have dropped a record born expired.
		require.True(t, err == nil || errors.Is(err, repository.ErrLeaseLost), "seed %q: %v", key, err)
		return
	}
	require.NoError(t, err)
}

// acquireParams returns valid params for key acquired now by owner, with a
// lease of leaseLength, expiring in a day, and the payload hash of the key.
func acquireParams(consumer, key, owner string) repository.AcquireParams {
	c := ClaimParams(consumer, key)
	return repository.AcquireParams{Consumer: c.Consumer, Key: c.Key, PayloadHash: c.PayloadHash,
		Owner: owner, Now: c.Now, LeaseUntil: c.Now.Add(leaseLength), ExpiresAt: c.ExpiresAt}
}

// requireFirstRecord checks what a record stored by the first claim or
// acquire of p holds, whatever its state: p's consumer, key and payload
// hash, no result, one attempt, created at p.Now and expiring at
// p.ExpiresAt.
func requireFirstRecord(t *testing.T, p repository.ClaimParams, rec repository.Record) {
	t.Helper()
	require.Equal(t, p.Consumer, rec.Consumer)
	require.Equal(t, p.Key, rec.Key)
	require.Equal(t, p.PayloadHash, rec.PayloadHash)
	require.Nil(t, rec.Result)
	require.Equal(t, 1, rec.Attempts)
	requireTime(t, p.Now, rec.CreatedAt, "CreatedAt")
	requireTime(t, p.ExpiresAt, rec.ExpiresAt, "ExpiresAt")
}

func requireTime(t *testing.T, want, got time.Time, field string) {
	t.Helper()
	require.True(t, want.Equal(got), "%s %s, want %s", field, got, want)
}
