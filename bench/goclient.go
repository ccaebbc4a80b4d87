package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/middleware/pgxinbox"
	"github.com/idemkit/watermill-idempotent/repository"
)

// scenarioGoGroup is FGX: G's statements on pgx in G's shape, as FG sends
// them with pgbench, but from Go: max(c/k, 1) goroutines, each with a
// connection of its own, each transaction pgxinbox's BeginClaimBatch
// (BEGIN and the k-row claim in one round trip, as G on pgx), k INSERTs
// and COMMIT, one after another. No router, no batcher, no delivery
// waits: the fastest any Go program runs G's chain of round trips on this
// machine, so G ÷ FGX is what the router, the batcher and the middleware
// cost on top of the driver, and FGX ÷ FG what the driver (pgx, the Go
// runtime's network wake-ups, sharing the cores with PostgreSQL) costs
// against pgbench's C client. Latencies are the transactions'.
func scenarioGoGroup(ctx context.Context, p *pgxDB, n, c, k int) (result, error) {
	t := &tables{d: p.pg}
	defer t.drop()
	b, err := newBusiness(ctx, p.pg, t, "bench_fgx")
	if err != nil {
		return result{}, err
	}
	repo, err := p.newRepo(ctx, t)
	if err != nil {
		return result{}, err
	}
	begin, ok := pgxinbox.Beginner(p.pool, repo, pgx.TxOptions{}).(middleware.BatchClaimBeginner)
	if !ok {
		return result{}, errors.New("pgxinbox.Beginner claims no batch")
	}
	clients := max(c/k, 1)
	perClient := max(n/(clients*k), 1)
	msgs := newMessages(clients * perClient * k)
	// batches[i] is the claim of msgs[i*k:(i+1)*k], built before the
	// clock starts, as pgbench's script is.
	batches := make([][]repository.ClaimParams, clients*perClient)
	now := time.Now()
	for i := range batches {
		params := make([]repository.ClaimParams, k)
		for j := range params {
			m := msgs[i*k+j]
			params[j] = repository.ClaimParams{Consumer: "bench", Key: m.UUID, PayloadHash: repository.HashPayload(m.Payload), Now: now, ExpiresAt: now.Add(7 * 24 * time.Hour)}
		}
		batches[i] = params
	}
	var (
		wg        sync.WaitGroup
		errs      = make([]error, clients)
		latencies = make([]time.Duration, len(batches))
	)
	run := func(i int) error {
		start := time.Now()
		tx, claims, err := begin.BeginClaimBatch(ctx, batches[i])
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		for _, cl := range claims {
			if !cl.Claimed {
				return errors.New("a fresh key was not claimed")
			}
		}
		q, ok := pgxinbox.TxFromContext(tx.WithTx(ctx))
		if !ok {
			return errors.New("no pgx transaction in the batch's context")
		}
		for _, m := range msgs[i*k : (i+1)*k] {
			if _, err := q.Exec(ctx, b.insertSQL, m.UUID, len(m.Payload)); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		latencies[i] = time.Since(start)
		return nil
	}
	trips := p.rt.load()
	start := time.Now()
	for g := range clients {
		wg.Go(func() {
			for i := g; i < len(batches); i += clients {
				if errs[g] = run(i); errs[g] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	trips = p.rt.load() - trips
	if err := errors.Join(errs...); err != nil {
		return result{}, err
	}
	return result{n: len(msgs), elapsed: elapsed, latencies: latencies, roundTrips: trips}, b.expect(ctx, len(msgs))
}
