// Package memory is an in-process inbox backend on a Go map, for unit
// tests and local experiments. It implements the two-phase contract
// (repository.TwoPhase) with the same semantics as the other backends —
// it passes the same conformance suite — but it keeps records in one
// process's memory: they are lost on exit and not shared between
// processes, so it cannot deduplicate deliveries across replicas or
// restarts. It cannot join a SQL transaction, so it does not implement
// repository.Driver.
//
//	repo := memory.NewRepository()
//	a, err := repo.Acquire(ctx, repository.AcquireParams{
//		Consumer:    "billing",
//		Key:         msg.UUID,
//		PayloadHash: repository.HashPayload(msg.Payload),
//		Owner:       watermill.NewUUID(),
//		Now:         now,
//		LeaseUntil:  now.Add(30 * time.Second),
//		ExpiresAt:   now.Add(7 * 24 * time.Hour),
//	})
//	if err == nil && a.Acquired {
//		// run the effect, then repo.Complete(…) or repo.Release(…)
//	}
//
// Every operation holds one mutex for its whole read-check-write, which is
// what makes it atomic here; stored byte slices are copied in and out.
package memory
