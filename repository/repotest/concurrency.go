package repotest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

// Racers is how many goroutines race on one key in the concurrency cases.
const Racers = 32

func runConcurrency(t *testing.T, b Backend) {
	t.Run("ConcurrentClaimsOneWinner", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, b)
		ctx := context.Background()
		p := ClaimParams("billing", "order-1")

		var (
			started  atomic.Int32 // goroutines that reached their claim
			allIn    = make(chan struct{})
			start    = make(chan struct{})
			wg       sync.WaitGroup
			winners  atomic.Int32
			results  = make([]repository.Claim, Racers)
			failures = make([]error, Racers)
		)
		for i := range Racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if started.Add(1) == Racers {
					close(allIn)
				}
				failures[i] = func() error {
					// On backends that lock at BEGIN (SQLite), the wait happens
					// here; elsewhere it happens in the claim.
					tx, err := b.DB.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					c, err := f.tx.ClaimTx(ctx, tx, p)
					if err != nil {
						return err
					}
					results[i] = c
					if !c.Claimed {
						return tx.Rollback()
					}
					winners.Add(1)
					if err := f.tx.SaveResultTx(ctx, tx, repository.SaveResultParams{
						Consumer: p.Consumer, Key: p.Key, Result: fmt.Appendf(nil, "winner-%d", i),
					}); err != nil {
						return err
					}
					// Hold the claim until every racer has set off, so the
					// others really contend with an uncommitted claim.
					<-allIn
					return tx.Commit()
				}()
			}()
		}
		close(start)
		wg.Wait()

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

	t.Run("ConcurrentRedeliveriesWithDifferentExpiriesOneWinnerPerKey", func(t *testing.T) {
		// Every racer computes its own expiry, days apart, as
		// redeliveries claimed at different times do: the expiry must not
		// take part in deciding the race.
		t.Parallel()
		f := newFixture(t, b)
		ctx := context.Background()
		const keys = 8
		now := time.Now().UTC().Truncate(time.Microsecond)
		var (
			start   = make(chan struct{})
			wg      sync.WaitGroup
			winners [keys]atomic.Int32
			results [keys][Racers]repository.Claim
			errs    [keys][Racers]error
		)
		for k := range keys {
			for i := range Racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p := ClaimParams("billing", fmt.Sprintf("order-%d", k))
					p.Now = now
					p.ExpiresAt = now.Add(time.Hour + time.Duration(i%4)*25*time.Hour)
					<-start
					errs[k][i] = func() error {
						tx, err := b.DB.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						defer func() { _ = tx.Rollback() }()
						c, err := f.tx.ClaimTx(ctx, tx, p)
						if err != nil {
							return err
						}
						results[k][i] = c
						if c.Claimed {
							winners[k].Add(1)
							if err := f.tx.SaveResultTx(ctx, tx, repository.SaveResultParams{
								Consumer: p.Consumer, Key: p.Key, Result: fmt.Appendf(nil, "winner-%d", i),
							}); err != nil {
								return err
							}
						}
						return tx.Commit()
					}()
				}()
			}
		}
		close(start)
		wg.Wait()
		for k := range keys {
			for i, err := range errs[k] {
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

	t.Run("ClaimBlockedByRolledBackClaimWins", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, b)
		ctx := context.Background()
		p := ClaimParams("billing", "order-1")

		first, err := b.DB.BeginTx(ctx, nil)
		require.NoError(t, err)
		c, err := f.tx.ClaimTx(ctx, first, p)
		require.NoError(t, err)
		require.True(t, c.Claimed)

		type outcome struct {
			claim repository.Claim
			err   error
		}
		done := make(chan outcome, 1)
		go func() {
			tx, err := b.DB.BeginTx(ctx, nil)
			if err != nil {
				done <- outcome{err: err}
				return
			}
			defer func() { _ = tx.Rollback() }()
			c, err := f.tx.ClaimTx(ctx, tx, p)
			if err == nil {
				err = tx.Commit()
			}
			done <- outcome{claim: c, err: err}
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
