// Package postgres is the PostgreSQL backend of the inbox, used through
// database/sql with the pgx/v5 stdlib driver.
//
//	db, _ := sql.Open("pgx", "postgres://localhost:5432/app")
//	repo, err := postgres.NewRepository(db, postgres.Config{})
//	if err != nil { … }
//	if err := repo.Migrate(ctx); err != nil { … }
//
// or natively on a pgx/v5 pool, with the transactional inbox's pgx.Tx
// handed to handlers by middleware/pgxinbox (sqlc's pgx mode takes it):
//
//	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
//	inbox, err := middleware.NewInbox(middleware.Config{
//		Beginner: pgxinbox.Beginner(pool, repo, pgx.TxOptions{}),
//	})
//	// in the handler:
//	tx, _ := pgxinbox.TxFromContext(msg.Context())
//	err := queries.WithTx(tx).InsertCharge(msg.Context(), params)
//
// Claims are `INSERT … ON CONFLICT DO NOTHING` against the primary key
// (consumer, dedup_key): a second transaction claiming the same key waits
// on the first one's row lock and then sees its outcome. Cleanup deletes
// expired rows by primary key in small batches with FOR UPDATE SKIP LOCKED,
// so it never waits on (or blocks) a claim. The schema is in migrations/.
//
// The two-phase contract (repository.TwoPhase) runs outside the caller's
// transaction: Acquire is an INSERT … ON CONFLICT DO NOTHING, and every
// later state change is one UPDATE or DELETE fenced by state and lease
// owner, so a stale owner matches no row and gets repository.ErrLeaseLost.
package postgres
