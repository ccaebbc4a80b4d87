// Package once runs a function once per key — a scheduled job, a webhook
// delivery, an ETL step — with no Watermill router involved, on the same
// stores and with the same guarantees and errors as the inboxes of package
// middleware.
//
// Transactional runs the function inside a SQL transaction that also
// holds the key's marker, so its writes and the marker commit together;
// the transaction is the repository's driver's (*sql.Tx here, pgx.Tx with
// postgres.NewPgxRepository):
//
//	repo, _ := postgres.NewRepository(db, postgres.Config{})
//	charges, err := once.NewTransactional(repo, once.Config{Scope: "stripe-webhook"})
//	if err != nil { … }
//	res, err := charges.Do(ctx, event.ID, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
//		_, err := tx.ExecContext(ctx, "INSERT INTO payments …")
//		return []byte("paid"), err // an error rolls back the payment and the marker together
//	})
//	// res.Replayed: an earlier delivery of event.ID already did it; res.Value is its output.
//
// TwoPhase works on every backend (memory, Redis and the SQL ones) for
// effects outside a database: it claims the key under a lease, runs the
// function while extending the lease, and stores its output — with the
// two-phase inbox's guarantees: storing the output (or releasing the key
// after a failure) is retried while the lease is held (TwoPhaseConfig.FinishRetry),
// fenced by the call's owner, and a store write that committed with its
// answer lost is recognised, so one dropped connection after the effect
// neither runs it twice nor strands a completed call; every store call is
// bounded by TwoPhaseConfig.StoreTimeout, and an extension still in flight when
// the function returns is abandoned rather than waited for.
//
// Errors: idempotency.ErrPayloadMismatch (the key was used with other
// input, see DoInput) and idempotency.ErrNeedsIntervention are permanent
// (idempotency.IsPermanent); *BusyError (idempotency.ErrInProgress) is
// transient: another call holds the key right now.
//
// Both run the module's one protocol (claim, run, store, answer a
// duplicate) with the inboxes, and report every call to TwoPhaseConfig.Observer
// (Config.Observer) as an idempotency.Delivery of Scope, so the
// metrics package counts calls as it counts deliveries.
package once
