package repotest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/resultcodec"
	"github.com/idemkit/watermill-idempotent/repository"
)

// operatorResult is a valid stored result, as middleware.EncodeResult
// builds it, with bytes that are not UTF-8 in every field.
var operatorResult = resultcodec.Encode([]resultcodec.Message{{
	UUID: "out-\xff\xfe-1", Metadata: map[string]string{"k\xff": "v\x00"}, Payload: []byte{0, 'o', 'k', 0xff},
}})

func runOperator(t *testing.T, b Backend) {
	require.True(t, b.Features.TwoPhase, "%s: Features.Operator requires Features.TwoPhase", b.Name)

	runCase(t, b, "ListStuckListsOnlyExpiredLeases", func(t *testing.T, f *fixture) {
		now := time.Now().UTC().Truncate(time.Microsecond)
		acquire := func(consumer, key, owner string, lease, expires time.Duration) {
			p := acquireParams(consumer, key, owner)
			p.Now, p.LeaseUntil, p.ExpiresAt = now, now.Add(lease), now.Add(expires)
			require.True(t, f.acquire(t, p).Acquired)
		}
		acquire("billing", "stuck-2", "owner-2", 2*time.Minute, 24*time.Hour)
		acquire("billing", "stuck-1", "owner-1", time.Minute, 24*time.Hour)
		acquire("billing", "live", "owner-live", time.Hour, 24*time.Hour)
		acquire("billing", "expired", "owner-x", time.Minute, 3*time.Minute)
		acquire("billing", "done", "owner-done", time.Minute, 24*time.Hour)
		require.NoError(t, f.tp.Complete(t.Context(), repository.CompleteParams{Consumer: "billing", Key: "done", Owner: "owner-done", Now: now}))
		acquire("shipping", "stuck-3", "owner-3", 90*time.Second, 24*time.Hour)
		// Consumers that a naive prefix or glob match would confuse.
		acquire("billing:eu", "stuck-4", "owner-4", time.Minute, 24*time.Hour)
		acquire("bill*", "stuck-5", "owner-5", time.Minute, 24*time.Hour)

		at := now.Add(5 * time.Minute)
		recs := f.listStuck(t, repository.ListStuckParams{Consumer: "billing", Now: at})
		require.Equal(t, []string{"billing/stuck-1", "billing/stuck-2"}, ids(recs))
		require.Equal(t, repository.StateInProgress, recs[0].State)
		require.Equal(t, "owner-1", recs[0].LeaseOwner)
		require.Equal(t, 1, recs[0].Attempts)
		requireTime(t, now.Add(time.Minute), recs[0].LeaseUntil, "LeaseUntil")
		require.Equal(t, repository.HashPayload([]byte("stuck-1")), recs[0].PayloadHash)

		all := f.listStuck(t, repository.ListStuckParams{Now: at})
		require.Equal(t, []string{"bill*/stuck-5", "billing/stuck-1", "billing:eu/stuck-4", "shipping/stuck-3", "billing/stuck-2"}, ids(all),
			"every consumer, oldest lease first, then by consumer and key")
		require.Equal(t, []string{"bill*/stuck-5"}, ids(f.listStuck(t, repository.ListStuckParams{Consumer: "bill*", Now: at})))
		require.Equal(t, []string{"billing:eu/stuck-4"}, ids(f.listStuck(t, repository.ListStuckParams{Consumer: "billing:eu", Now: at})))
		require.Equal(t, []string{"bill*/stuck-5", "billing/stuck-1"}, ids(f.listStuck(t, repository.ListStuckParams{Now: at, Limit: 2})))

		// A lease is stuck from its deadline on, not before.
		require.Equal(t, []string{"billing/expired", "billing/stuck-1"}, ids(f.listStuck(t, repository.ListStuckParams{Consumer: "billing", Now: now.Add(time.Minute)})),
			"before its ExpiresAt an expired lease is stuck")
		require.Empty(t, f.listStuck(t, repository.ListStuckParams{Consumer: "billing", Now: now.Add(time.Minute - time.Microsecond)}))
		require.Empty(t, f.listStuck(t, repository.ListStuckParams{Consumer: "nobody", Now: at}))
	})

	runCase(t, b, "ResolveCompleteMakesLaterDeliveriesDuplicates", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		at := p.LeaseUntil.Add(time.Minute)
		stuck := f.listStuck(t, repository.ListStuckParams{Consumer: "billing", Now: at})
		require.Len(t, stuck, 1)

		result := operatorResult
		require.NoError(t, f.op.Resolve(ctx, repository.ResolveParams{
			Consumer: "billing", Key: stuck[0].Key, ExpectedOwner: stuck[0].LeaseOwner,
			Action: repository.ResolveComplete, Result: result, Now: at,
		}))
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Equal(t, result, rec.Result)
		requireTime(t, at, rec.CompletedAt, "CompletedAt")
		require.Equal(t, 1, rec.Attempts)
		require.Empty(t, f.listStuck(t, repository.ListStuckParams{Consumer: "billing", Now: at}))

		next := acquireParams("billing", "order-1", "owner-b")
		next.Now, next.LeaseUntil = at, at.Add(leaseLength)
		a := f.acquire(t, next)
		require.False(t, a.Acquired)
		require.Equal(t, repository.StateCompleted, a.Existing.State)
		require.Equal(t, result, a.Existing.Result)

		for _, action := range []repository.ResolveAction{repository.ResolveComplete, repository.ResolveRelease} {
			err := f.op.Resolve(ctx, repository.ResolveParams{
				Consumer: "billing", Key: "order-1", ExpectedOwner: "owner-a", Action: action, Now: at,
			})
			require.ErrorIs(t, err, repository.ErrLeaseLost, "a completed record cannot be resolved again (%s)", action)
		}
		require.Equal(t, result, f.get(t, "billing", "order-1").Result)
	})

	runCase(t, b, "ResolveCompleteRefusesWhatCannotReplay", func(t *testing.T, f *fixture) {
		p := f.acquired(t, "billing", "order-1", "owner-a")
		for name, result := range map[string][]byte{
			"free text":         []byte("charged"),
			"empty JSON object": []byte("{}"),
			"truncated":         operatorResult[:len(operatorResult)-1],
		} {
			err := f.op.Resolve(t.Context(), repository.ResolveParams{
				Consumer: "billing", Key: "order-1", ExpectedOwner: "owner-a", Action: repository.ResolveComplete, Result: result, Now: p.LeaseUntil,
			})
			require.ErrorIs(t, err, repository.ErrInvalidParams, name)
			require.Equal(t, repository.StateInProgress, f.get(t, "billing", "order-1").State, "a refused resolve changes nothing (%s)", name)
		}
		// Release ignores Result: an operator releasing needs none.
		require.NoError(t, f.op.Resolve(t.Context(), repository.ResolveParams{
			Consumer: "billing", Key: "order-1", ExpectedOwner: "owner-a", Action: repository.ResolveRelease, Result: []byte("charged"), Now: p.LeaseUntil,
		}))
	})

	runCase(t, b, "ResolveCompleteWithoutResultStoresNil", func(t *testing.T, f *fixture) {
		p := f.acquired(t, "billing", "order-1", "owner-a")
		require.NoError(t, f.op.Resolve(t.Context(), repository.ResolveParams{
			Consumer: "billing", Key: "order-1", ExpectedOwner: "owner-a", Action: repository.ResolveComplete, Now: p.LeaseUntil,
		}))
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateCompleted, rec.State)
		require.Nil(t, rec.Result)
	})

	runCase(t, b, "ResolveReleaseLetsTheNextDeliveryRun", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		at := p.LeaseUntil.Add(time.Minute)
		require.NoError(t, f.op.Resolve(ctx, repository.ResolveParams{
			Consumer: "billing", Key: "order-1", ExpectedOwner: "owner-a", Action: repository.ResolveRelease, Now: at,
		}))
		_, err := f.repo.Get(ctx, "billing", "order-1")
		require.ErrorIs(t, err, repository.ErrNotFound)

		next := acquireParams("billing", "order-1", "owner-b")
		next.Now, next.LeaseUntil = at, at.Add(leaseLength)
		require.True(t, f.acquire(t, next).Acquired, "after a release the next delivery claims afresh")

		err = f.op.Resolve(ctx, repository.ResolveParams{
			Consumer: "billing", Key: "order-1", ExpectedOwner: "owner-a", Action: repository.ResolveRelease, Now: at,
		})
		require.ErrorIs(t, err, repository.ErrLeaseLost, "a second release by the stale owner must not delete the new claim")
		require.Equal(t, "owner-b", f.get(t, "billing", "order-1").LeaseOwner)
	})

	runCase(t, b, "ResolveIsFencedByOwnerAndLease", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		p := f.acquired(t, "billing", "order-1", "owner-a")
		resolve := func(owner string, action repository.ResolveAction, now time.Time) error {
			return f.op.Resolve(ctx, repository.ResolveParams{
				Consumer: "billing", Key: "order-1", ExpectedOwner: owner, Action: action, Result: operatorResult, Now: now,
			})
		}
		for _, action := range []repository.ResolveAction{repository.ResolveComplete, repository.ResolveRelease} {
			require.ErrorIs(t, resolve("owner-a", action, p.LeaseUntil.Add(-time.Microsecond)), repository.ErrLeaseLost,
				"a live lease is being worked on (%s)", action)
			require.ErrorIs(t, resolve("owner-z", action, p.LeaseUntil), repository.ErrLeaseLost, "wrong owner (%s)", action)
		}

		// The operator saw owner-a; meanwhile a redelivery reclaimed it.
		at := p.LeaseUntil.Add(time.Minute)
		_, err := f.tp.Reclaim(ctx, repository.ReclaimParams{
			Consumer: "billing", Key: "order-1", PrevOwner: "owner-a", Owner: "owner-b", Now: at, LeaseUntil: at.Add(leaseLength),
		})
		require.NoError(t, err)
		for _, action := range []repository.ResolveAction{repository.ResolveComplete, repository.ResolveRelease} {
			require.ErrorIs(t, resolve("owner-a", action, at.Add(2*leaseLength)), repository.ErrLeaseLost,
				"an operator must never overwrite a reclaimed record (%s)", action)
		}
		rec := f.get(t, "billing", "order-1")
		require.Equal(t, repository.StateInProgress, rec.State)
		require.Equal(t, "owner-b", rec.LeaseOwner)
		require.Nil(t, rec.Result)
		require.Equal(t, 2, rec.Attempts)

		for _, action := range []repository.ResolveAction{repository.ResolveComplete, repository.ResolveRelease} {
			err := f.op.Resolve(ctx, repository.ResolveParams{
				Consumer: "billing", Key: "no-such-key", ExpectedOwner: "owner-a", Action: action, Now: at,
			})
			require.ErrorIs(t, err, repository.ErrNotFound, "%s", action)
			err = f.op.Resolve(ctx, repository.ResolveParams{
				Consumer: "shipping", Key: "order-1", ExpectedOwner: "owner-b", Action: action, Now: at.Add(2 * leaseLength),
			})
			require.ErrorIs(t, err, repository.ErrNotFound, "keys are scoped by consumer (%s)", action)
		}
	})

	runCase(t, b, "ResolveOfExpiredRecordIsNotFound", func(t *testing.T, f *fixture) {
		p := f.acquired(t, "billing", "order-1", "owner-a")
		err := f.op.Resolve(t.Context(), repository.ResolveParams{
			Consumer: "billing", Key: "order-1", ExpectedOwner: "owner-a", Action: repository.ResolveComplete, Now: p.ExpiresAt,
		})
		require.ErrorIs(t, err, repository.ErrNotFound, "a record past its ExpiresAt is gone for every backend")
		require.Empty(t, f.listStuck(t, repository.ListStuckParams{Now: p.ExpiresAt}))
	})

	runCase(t, b, "LongKeyIsResolvedByItsStoredKey", func(t *testing.T, f *fixture) {
		long := strings.Repeat("k", repository.MaxKeyLength+1)
		p := f.acquired(t, "billing", long, "owner-a")
		at := p.LeaseUntil
		stuck := f.listStuck(t, repository.ListStuckParams{Consumer: "billing", Now: at})
		require.Len(t, stuck, 1)
		require.Equal(t, repository.StorageKey(long), stuck[0].Key)

		err := f.op.Resolve(t.Context(), repository.ResolveParams{
			Consumer: "billing", Key: long, ExpectedOwner: "owner-a", Action: repository.ResolveComplete, Now: at,
		})
		require.ErrorIs(t, err, repository.ErrInvalidParams, "an original long key is not a stored key")
		require.NoError(t, f.op.Resolve(t.Context(), repository.ResolveParams{
			Consumer: "billing", Key: stuck[0].Key, ExpectedOwner: "owner-a", Action: repository.ResolveComplete, Now: at,
		}))
		require.Equal(t, repository.StateCompleted, f.get(t, "billing", long).State)
	})

	runCase(t, b, "ResolveRacingReclaimsHasOneWinner", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		const keys, racers = 10, 4 // per key: racers reclaims, racers completes, racers releases
		base := acquireParams("billing", "k", "owner-a")
		at := base.LeaseUntil.Add(time.Minute)
		for k := range keys {
			p := base
			p.Key = fmt.Sprintf("order-%d", k)
			p.PayloadHash = repository.HashPayload([]byte(p.Key))
			require.True(t, f.acquire(t, p).Acquired)
		}
		type win struct{ who string }
		wins := make([][]win, keys)
		var (
			mu    sync.Mutex
			wg    sync.WaitGroup
			start = make(chan struct{})
			errs  []error
		)
		record := func(k int, who string, err error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins[k] = append(wins[k], win{who})
			case !isLeaseLostOrNotFound(err):
				errs = append(errs, err)
			}
		}
		for k := range keys {
			key := fmt.Sprintf("order-%d", k)
			for i := range racers {
				wg.Add(3)
				go func() {
					defer wg.Done()
					<-start
					_, err := f.tp.Reclaim(ctx, repository.ReclaimParams{
						Consumer: "billing", Key: key, PrevOwner: "owner-a", Owner: fmt.Sprintf("reclaimer-%d", i),
						Now: at, LeaseUntil: at.Add(leaseLength),
					})
					record(k, "reclaim", err)
				}()
				for _, action := range []repository.ResolveAction{repository.ResolveComplete, repository.ResolveRelease} {
					go func() {
						defer wg.Done()
						<-start
						err := f.op.Resolve(ctx, repository.ResolveParams{
							Consumer: "billing", Key: key, ExpectedOwner: "owner-a", Action: action,
							Result: operatorResult, Now: at,
						})
						record(k, action.String(), err)
					}()
				}
			}
		}
		close(start)
		wg.Wait()
		require.Empty(t, errs)
		for k := range keys {
			key := fmt.Sprintf("order-%d", k)
			require.Len(t, wins[k], 1, "%s: exactly one of the reclaims and resolutions may win, got %v", key, wins[k])
			rec, err := f.repo.Get(ctx, "billing", key)
			switch wins[k][0].who {
			case "reclaim":
				require.NoError(t, err)
				require.Equal(t, repository.StateInProgress, rec.State)
				require.True(t, strings.HasPrefix(rec.LeaseOwner, "reclaimer-"), rec.LeaseOwner)
			case "complete":
				require.NoError(t, err)
				require.Equal(t, repository.StateCompleted, rec.State)
				require.Equal(t, operatorResult, rec.Result)
			case "release":
				require.ErrorIs(t, err, repository.ErrNotFound)
			}
		}
	})

	runCase(t, b, "InvalidParamsAreRefused", func(t *testing.T, f *fixture) {
		ctx := t.Context()
		now := time.Now()
		for name, p := range map[string]repository.ListStuckParams{
			"no now":         {Consumer: "billing"},
			"negative limit": {Now: now, Limit: -1},
		} {
			_, err := f.op.ListStuck(ctx, p)
			require.ErrorIs(t, err, repository.ErrInvalidParams, name)
		}
		for name, consumer := range invalidConsumers {
			_, err := f.op.ListStuck(ctx, repository.ListStuckParams{Now: now, Consumer: consumer})
			require.ErrorIs(t, err, repository.ErrInvalidParams, "list stuck: %s", name)
		}
		valid := repository.ResolveParams{Consumer: "billing", Key: "k", ExpectedOwner: "o", Action: repository.ResolveRelease, Now: now}
		for name, mutate := range map[string]func(*repository.ResolveParams){
			"no consumer":    func(p *repository.ResolveParams) { p.Consumer = "" },
			"no key":         func(p *repository.ResolveParams) { p.Key = "" },
			"no owner":       func(p *repository.ResolveParams) { p.ExpectedOwner = "" },
			"no action":      func(p *repository.ResolveParams) { p.Action = 0 },
			"unknown action": func(p *repository.ResolveParams) { p.Action = 7 },
			"no now":         func(p *repository.ResolveParams) { p.Now = time.Time{} },
			"long key":       func(p *repository.ResolveParams) { p.Key = strings.Repeat("k", repository.MaxKeyLength+1) },
			"key with NUL":   func(p *repository.ResolveParams) { p.Key = "k\x00" },
			"consumer NUL":   func(p *repository.ResolveParams) { p.Consumer = "bill\x00ing" },
		} {
			p := valid
			mutate(&p)
			require.ErrorIs(t, f.op.Resolve(ctx, p), repository.ErrInvalidParams, name)
		}
		_, err := f.repo.Get(ctx, "billing", "k")
		require.ErrorIs(t, err, repository.ErrNotFound)
	})
}

// listStuck lists the stuck records p selects and requires no error.
func (f *fixture) listStuck(t *testing.T, p repository.ListStuckParams) []repository.Record {
	t.Helper()
	recs, err := f.op.ListStuck(context.Background(), p)
	require.NoError(t, err)
	return recs
}

// ids returns "consumer/key" of each record, in order.
func ids(recs []repository.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Consumer + "/" + r.Key
	}
	return out
}

func isLeaseLostOrNotFound(err error) bool {
	return errors.Is(err, repository.ErrLeaseLost) || errors.Is(err, repository.ErrNotFound)
}
