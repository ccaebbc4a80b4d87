package memory_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// A two-phase round: the first attempt acquires the key and crashes
// mid-effect; a redelivery after the lease ran out sees it stale and
// reclaims it; the crashed attempt can no longer complete; the new owner
// completes, and a later redelivery is a duplicate that replays the result.
func Example() {
	ctx := context.Background()
	repo := memory.NewRepository()
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	acquire := func(owner string, now time.Time) repository.Acquisition {
		a, err := repo.Acquire(ctx, repository.AcquireParams{
			Consumer: "billing", Key: "order-42", PayloadHash: repository.HashPayload([]byte("charge 10€")),
			Owner: owner, Now: now, LeaseUntil: now.Add(30 * time.Second), ExpiresAt: now.Add(7 * 24 * time.Hour),
		})
		if err != nil {
			panic(err)
		}
		return a
	}

	fmt.Println("attempt-1 acquired:", acquire("attempt-1", now).Acquired)

	later := now.Add(time.Minute)
	a := acquire("attempt-2", later)
	fmt.Println("attempt-2 acquired:", a.Acquired, "stale:", !a.Existing.LeaseUntil.After(later))
	rec, err := repo.Reclaim(ctx, repository.ReclaimParams{
		Consumer: "billing", Key: "order-42", PrevOwner: a.Existing.LeaseOwner, Owner: "attempt-2",
		Now: later, LeaseUntil: later.Add(30 * time.Second),
	})
	fmt.Println("reclaimed:", err == nil, "attempts:", rec.Attempts)

	err = repo.Complete(ctx, repository.CompleteParams{Consumer: "billing", Key: "order-42", Owner: "attempt-1", Now: later})
	fmt.Println("attempt-1 lost its lease:", errors.Is(err, repository.ErrLeaseLost))

	err = repo.Complete(ctx, repository.CompleteParams{
		Consumer: "billing", Key: "order-42", Owner: "attempt-2", Result: []byte("receipt-7"), Now: later,
	})
	fmt.Println("attempt-2 completed:", err == nil)

	a = acquire("attempt-3", later.Add(time.Hour))
	fmt.Printf("attempt-3 acquired: %v, replays %q\n", a.Acquired, a.Existing.Result)
	// Output:
	// attempt-1 acquired: true
	// attempt-2 acquired: false stale: true
	// reclaimed: true attempts: 2
	// attempt-1 lost its lease: true
	// attempt-2 completed: true
	// attempt-3 acquired: false, replays "receipt-7"
}
