// Package repository defines the storage contracts behind the idempotent
// consumer (inbox) middleware: the record kept for every (consumer, key),
// the small interfaces a backend implements, the sentinel errors they share
// and helpers used by the SQL backends.
//
// The transactional contract ([Driver], generic over the driver's
// transaction: *sql.Tx or pgx.Tx) claims a marker inside a SQL
// transaction, so the marker commits or rolls back together with the
// handler's business writes:
//
//	tx, claims, err := repo.BeginClaim(ctx, []repository.ClaimParams{{
//		Consumer:    "billing",
//		Key:         msg.UUID,
//		PayloadHash: repository.HashPayload(msg.Payload),
//		Now:         now,
//		ExpiresAt:   now.Add(7 * 24 * time.Hour),
//	}})
//	if err == nil && !claims[0].Claimed {
//		// duplicate: claims[0].Existing holds the stored record
//	}
//
// Races are decided by the database: a claim is one atomic conditional
// insert against a unique (consumer, key) constraint, never a read followed
// by a write. Backends live in sub-packages (postgres, sqlite, …) and are
// all exercised by the conformance suite in repository/repotest.
package repository
