// Package postgres is the PostgreSQL backend of the inbox, on database/sql
// with the pgx/v5 stdlib driver or natively on a pgx/v5 pool:
//
//	repo, err := postgres.NewRepository(db, postgres.Config{}) // db from sql.Open("pgx", dsn)
//	if err != nil { … }
//	if err := repo.Migrate(ctx); err != nil { … }
//
//	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
//	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop"})
//	// in the handler, hand the pgx.Tx to sqlc's pgx-mode queries:
//	tx, err := idempotency.Tx[pgx.Tx](msg.Context())
//	if err != nil {
//		return nil, err
//	}
//	err = queries.WithTx(tx).InsertCharge(msg.Context(), params)
//
// Both are a repository.Driver, for *sql.Tx and pgx.Tx transactions, and
// send the same statements.
//
// Claims and Acquire are INSERT … ON CONFLICT DO NOTHING on the primary key
// (consumer, dedup_key): a second transaction claiming the key waits on the
// first one's row lock, then sees its outcome. Every later two-phase change
// is one UPDATE or DELETE fenced by state and lease owner, so a stale owner
// gets repository.ErrLeaseLost. Cleanup deletes expired rows by primary key
// with FOR UPDATE SKIP LOCKED, so it never waits on a claim. The schema is
// in migrations/.
package postgres
