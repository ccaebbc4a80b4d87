package repotest

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

// Racers is how many goroutines race on one key in the concurrency cases.
const Racers = 32

func runConcurrency(t *testing.T, b Backend) {
	runCase(t, b, "ConcurrentClaimsOneWinner", func(t *testing.T, f *fixture) {
		ctx := context.Background()
		p := ClaimParams("billing", "order-1")

		var (
			started atomic.Int32 // goroutines that reached their claim
			allIn   = make(chan struct{})
			winners atomic.Int32
			results = make([]repository.Claim, Racers)
		)
		failures := race(Racers, func(i int) error {
			if started.Add(1) == Racers {
				close(allIn)
			}
			// On backends that lock at BEGIN (SQLite), the wait happens
			// here; elsewhere it happens in the claim.
			return inTx(ctx, b.DB, func(tx *sql.Tx) error {
				c, err := claimOne(ctx, f.tx, tx, p)
				results[i] = c
				if err != nil || !c.Claimed {
					return err
				}
				winners.Add(1)
				if err := f.tx.SaveResult(ctx, tx, repository.SaveResultParams{
					Consumer: p.Consumer, Key: p.Key, Result: fmt.Appendf(nil, "winner-%d", i),
				}); err != nil {
					return err
				}
				// Hold the claim until every racer has set off, so the
				// others really contend with an uncommitted claim.
				<-allIn
				return nil
			})
		})

		for i, err := range failures {
			require.NoError(t, err, "racer %d", i)
		}
		require.EqualValues(t, 1, winners.Load(), "exactly one racer must win the claim")
		var winner []byte
		for i, c := range results {
			if c.Claimed {
				winner = fmt.Appendf(nil, "winner-%d", i)
			}
		}
		for i, c := range results {
			if c.Claimed {
				continue
			}
			require.Equal(t, repository.StateCompleted, c.Existing.State, "racer %d", i)
			require.Equal(t, winner, c.Existing.Result, "racer %d must see the winner's committed record", i)
		}
	})

	runCase(t, b, "ConcurrentRedeliveriesWithDifferentExpiriesOneWinnerPerKey", func(t *testing.T, f *fixture) {
		// Every racer computes its own expiry, days apart, as
		// redeliveries claimed at different times do: the expiry must not
		// take part in deciding the race.
		ctx := context.Background()
		const keys = 8
		now := time.Now().UTC().Truncate(time.Microsecond)
		var (
			winners [keys]atomic.Int32
			results [keys][Racers]repository.Claim
		)
		// Racer n claims key n/Racers as its racer n%Racers.
		errs := race(keys*Racers, func(n int) error {
			k, i := n/Racers, n%Racers
			p := ClaimParams("billing", fmt.Sprintf("order-%d", k))
			p.Now = now
			p.ExpiresAt = now.Add(time.Hour + time.Duration(i%4)*25*time.Hour)
			return inTx(ctx, b.DB, func(tx *sql.Tx) error {
				c, err := claimOne(ctx, f.tx, tx, p)
				if err != nil {
					return err
				}
				results[k][i] = c
				if !c.Claimed {
					return nil
				}
				winners[k].Add(1)
				return f.tx.SaveResult(ctx, tx, repository.SaveResultParams{
					Consumer: p.Consumer, Key: p.Key, Result: fmt.Appendf(nil, "winner-%d", i),
				})
			})
		})
		for k := range keys {
			for i, err := range errs[k*Racers : (k+1)*Racers] {
				require.NoError(t, err, "key %d racer %d", k, i)
			}
			require.EqualValues(t, 1, winners[k].Load(), "key %d: exactly one of %d racers must win", k, Racers)
			rec, err := f.repo.Get(ctx, "billing", fmt.Sprintf("order-%d", k))
			require.NoError(t, err)
			for i, c := range results[k] {
				if !c.Claimed {
					require.Equal(t, rec.Result, c.Existing.Result, "key %d racer %d must see the winner's record", k, i)
					require.True(t, rec.ExpiresAt.Equal(c.Existing.ExpiresAt), "key %d racer %d", k, i)
				}
			}
		}
	})

	runCase(t, b, "ClaimBlockedByRolledBackClaimWins", func(t *testing.T, f *fixture) {
		ctx := context.Background()
		p := ClaimParams("billing", "order-1")
		first := f.claimOpen(t, p)

		type outcome struct {
			claim repository.Claim
			err   error
		}
		done := make(chan outcome, 1)
		go func() {
			var o outcome
			o.err = inTx(ctx, b.DB, func(tx *sql.Tx) (err error) {
				o.claim, err = claimOne(ctx, f.tx, tx, p)
				return err
			})
			done <- o
		}()

		// The second claim cannot finish while the first holds the key.
		select {
		case o := <-done:
			t.Fatalf("second claim finished while the first was open: %+v", o)
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(t, first.Rollback())
		o := <-done
		require.NoError(t, o.err)
		require.True(t, o.claim.Claimed, "after the first claim rolled back, the waiting claim must win")
	})
}
