package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/watermill-idempotent/repository"
)

// scenarioGoGroup is FGX: G's statements on pgx in G's shape, as FG sends
// them with pgbench, but from Go: max(c/k, 1) goroutines, each with a
// connection of its own, each transaction the pgx repository's BeginClaim
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
	b, begin, err := p.groupTables(ctx, t, "bench_fgx")
	if err != nil {
		return result{}, err
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
			params[j] = benchClaim(msgs[i*k+j], now)
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
		if err := groupTx(ctx, begin, b, batches[i], msgs[i*k:(i+1)*k]); err != nil {
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

// groupTables creates a business table (prefix) and an inbox table for
// one run of G's SQL from Go, and returns the business table and the pgx
// repository on the inbox, whose BeginClaim begins a transaction and
// claims a batch's keys in one round trip.
func (p *pgxDB) groupTables(ctx context.Context, t *tables, prefix string) (*business, repository.Driver[pgx.Tx], error) {
	b, err := newBusiness(ctx, p.pg, t, prefix)
	if err != nil {
		return nil, nil, err
	}
	repo, err := p.newRepo(ctx, t)
	if err != nil {
		return nil, nil, err
	}
	return b, repo, nil
}

// benchClaim is the claim of m's key at now, as the harness's inboxes
// make it.
func benchClaim(m *message.Message, now time.Time) repository.ClaimParams {
	return repository.ClaimParams{Consumer: "bench", Key: m.UUID, PayloadHash: repository.HashPayload(m.Payload), Now: now, ExpiresAt: now.Add(7 * 24 * time.Hour)}
}

// groupTx is one transaction of G's statements for msgs, whose claims are
// params: BEGIN and the claim in one round trip, an INSERT each, COMMIT.
func groupTx(ctx context.Context, d repository.Driver[pgx.Tx], b *business, params []repository.ClaimParams, msgs []*message.Message) error {
	tx, claims, err := d.BeginClaim(ctx, params)
	if err != nil {
		return err
	}
	defer func() { _ = d.Rollback(context.WithoutCancel(ctx), tx) }()
	for _, cl := range claims {
		if !cl.Claimed {
			return errors.New("a fresh key was not claimed")
		}
	}
	for _, m := range msgs {
		if _, err := tx.Exec(ctx, b.insertSQL, m.UUID, len(m.Payload)); err != nil {
			return err
		}
	}
	return d.Commit(ctx, tx)
}

// scenarioRouterGroup is FGR: FGX's transactions (groupTx) fed by the
// harness's router, as G is (deliver: c deliveries in flight, each
// acknowledged before its feeder publishes the next), and grouped by the
// simplest batcher one would write by hand (plainBatcher): k deliveries,
// or fewer after wait, in one transaction, run by the delivery that filled
// it. No inbox middleware, no adaptation, no observation: G ÷ FGR is what
// the inbox's batcher and middleware cost against hand-written group
// commit behind the same router, and FGR ÷ FGX what feeding batches from
// a router costs (a batch fills only as earlier batches' deliveries are
// acknowledged and replaced). Latencies are the handler chain's, as G's.
func scenarioRouterGroup(ctx context.Context, p *pgxDB, n, c, k int, wait time.Duration) (result, error) {
	t := &tables{d: p.pg}
	defer t.drop()
	b, begin, err := p.groupTables(ctx, t, "bench_fgr")
	if err != nil {
		return result{}, err
	}
	pb := &plainBatcher{k: min(k, c), wait: wait, run: func(msgs []*message.Message) error {
		now := time.Now()
		params := make([]repository.ClaimParams, len(msgs))
		for j, m := range msgs {
			params[j] = benchClaim(m, now)
		}
		return groupTx(context.WithoutCancel(ctx), begin, b, params, msgs)
	}}
	r, err := p.deliver(ctx, pb.handle, newMessages(n), c)
	if err != nil {
		return result{}, err
	}
	return r, b.expect(ctx, n)
}

// plainBatcher is group commit as one writes it by hand: a delivery joins
// the pending batch; the one that fills it to k runs it, and a batch not
// full after wait (from its first delivery) runs on the timer's
// goroutine. Every delivery returns its batch's error.
type plainBatcher struct {
	k    int
	wait time.Duration
	run  func([]*message.Message) error

	mu      sync.Mutex
	pending []*plainDelivery
	gen     uint64 // the pending batch's number
	timer   *time.Timer
}

type plainDelivery struct {
	msg  *message.Message
	done chan error
}

func (pb *plainBatcher) handle(msg *message.Message) ([]*message.Message, error) {
	d := &plainDelivery{msg: msg, done: make(chan error, 1)}
	pb.mu.Lock()
	pb.pending = append(pb.pending, d)
	if len(pb.pending) == 1 && pb.k > 1 {
		gen := pb.gen
		pb.timer = time.AfterFunc(pb.wait, func() { pb.flush(gen) })
	}
	var batch []*plainDelivery
	if len(pb.pending) >= pb.k {
		batch = pb.take()
	}
	pb.mu.Unlock()
	if batch != nil {
		pb.exec(batch)
	}
	return nil, <-d.done
}

// flush runs batch gen if it is still pending: its wait ran out.
func (pb *plainBatcher) flush(gen uint64) {
	pb.mu.Lock()
	var batch []*plainDelivery
	if pb.gen == gen && len(pb.pending) > 0 {
		batch = pb.take()
	}
	pb.mu.Unlock()
	if batch != nil {
		pb.exec(batch)
	}
}

// take empties the pending batch and returns it. pb.mu is held.
func (pb *plainBatcher) take() []*plainDelivery {
	batch := pb.pending
	pb.pending = nil
	pb.gen++
	if pb.timer != nil {
		pb.timer.Stop()
		pb.timer = nil
	}
	return batch
}

func (pb *plainBatcher) exec(batch []*plainDelivery) {
	msgs := make([]*message.Message, len(batch))
	for j, d := range batch {
		msgs[j] = d.msg
	}
	err := pb.run(msgs)
	for _, d := range batch {
		d.done <- err
	}
}
