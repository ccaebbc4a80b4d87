package middleware

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

const (
	// DefaultBatchMaxWait is BatchConfig.MaxWait's default.
	DefaultBatchMaxWait = 5 * time.Millisecond
	// MaxBatchMessages is the largest BatchConfig.MaxMessages.
	MaxBatchMessages = 1000

	// batchAttempts bounds how often a batch runs again after the
	// database gave its transaction up (deadlock victim, serialization
	// failure).
	batchAttempts = 10
)

// BatchConfig turns on group commit (see Config.Batch and docs/batching.md).
type BatchConfig struct {
	// MaxMessages is the most deliveries one transaction holds. 0 or 1:
	// group commit is off and every delivery has its own transaction. Set
	// it to about half the number of deliveries in flight at once (router
	// handlers × their prefetch), so that one batch fills while another
	// runs: a batch runs as soon as it is full. With fewer database
	// connections than deliveries in flight, the deliveries in flight
	// divided by the connections is enough (a batch waiting for a
	// connection goes on filling, see repository.Driver's Reserve). At most
	// MaxBatchMessages.
	MaxMessages int
	// MaxWait is the longest the first delivery of a batch waits for
	// others before the batch runs with what it has: the latency group
	// commit may add to a delivery. A batch stops waiting sooner when no
	// other delivery can join it (the inbox learns how many deliveries
	// come at once when a MaxWait runs out). Default:
	// DefaultBatchMaxWait (5 ms).
	MaxWait time.Duration
	// Fixed keeps every batch's limit at MaxMessages. By default the
	// limit adapts (1, 2, 4 … MaxMessages) to the deliveries the inbox
	// completes per second, shrinking to single deliveries where batches
	// lose: slow round trips to the database, a slow handler. Set Fixed where
	// batches always win, for example more deliveries in flight than
	// database connections, to skip the adaptation's probes. Default:
	// false (adaptive).
	Fixed bool
}

func (b *BatchConfig) setDefaults() {
	if b.MaxMessages > 1 && b.MaxWait == 0 {
		b.MaxWait = DefaultBatchMaxWait
	}
}

func (b BatchConfig) validate() []error {
	var errs []error
	if b.MaxMessages < 0 || b.MaxMessages > MaxBatchMessages {
		errs = append(errs, fmt.Errorf("config.Batch.MaxMessages must be between 0 and %d, got %d", MaxBatchMessages, b.MaxMessages))
	}
	if b.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("config.Batch.MaxWait must not be negative, got %s", b.MaxWait))
	}
	return errs
}

// batcher groups concurrent deliveries into shared transactions.
//
// There is no goroutine of its own: the first delivery to arrive when no
// batch is collecting becomes the leader; it waits until the batch is
// complete (see complete) or MaxWait has passed, takes them, hands the
// collecting over to the next pending delivery (so the next batch fills
// while this one runs) and runs the batch on its own goroutine (the
// router's, for its message). Every
// other delivery waits for the outcome of the commit that holds its
// marker, so the backlog is bounded by the deliveries the subscribers hand
// out at once, and nothing outlives the calls that brought it.
type batcher struct {
	inbox *Inbox
	max   int
	wait  time.Duration

	mu      sync.Mutex
	pending []*delivery
	leading bool          // a delivery is collecting the next batch
	full    chan struct{} // closed when the batch is complete while one collects
	// inside counts the deliveries submitted and not yet done: pending,
	// or in a batch that runs.
	inside int
	// capacity is how many deliveries the subscribers hand out at once,
	// as far as the batcher can tell: what was inside when a leader's
	// MaxWait last ran out, raised whenever more came in. 0: unknown.
	capacity int
	// running counts the batches taken and not yet finished.
	running int
	// policy adapts the batches' size (batch_adapt.go): b.limit(), at
	// most max; with fixed the limit is max.
	policy batchPolicy
	fixed  bool
}

// complete reports whether the collecting batch should run now: it holds
// the limit's deliveries, or every delivery the subscribers hand out is
// inside (pending, or in a running batch), so that no other can join
// before a running batch commits, and fewer batches run than the
// capacity fills at the limit (c in flight at limit k make ⌈c/k⌉ batches
// side by side: 12 at limit 8 run 8 and 4).
//
// Without the second condition nothing would make small batches merge
// again: once c batches of one run side by side (after a window at limit
// 1, see batch_adapt.go), every delivery that comes back finds all the
// others inside and runs alone, and group commit stays the plain inbox
// with a batch's overhead (measured at 16 in flight, limit 8: 132
// batches of one among 387). With it, a delivery that comes back while
// those run waits for the others, until the limit or MaxWait. b.mu is
// held.
func (b *batcher) complete() bool {
	limit := b.limit()
	if len(b.pending) >= limit {
		return true
	}
	return b.capacity > 0 && b.inside >= b.capacity && b.running < (b.capacity+limit-1)/limit
}

// wakeIfComplete tells the delivery collecting the batch that it is
// complete, if it is and the delivery has not been told. b.mu is held.
func (b *batcher) wakeIfComplete() {
	if b.full != nil && b.complete() {
		close(b.full)
		b.full = nil
	}
}

// delivery is one message waiting for, or running in, a batch.
type delivery struct {
	h          message.HandlerFunc
	msg        *message.Message
	ctx        context.Context
	obs        *observation
	scope, key string
	id         string // scope and stored key: one per batch
	hash       []byte
	claim      repository.ClaimParams

	lead chan struct{} // closed: collect the next batch
	done chan struct{} // closed: the fields below are final

	existing *repository.Record // a duplicate: replay it
	ran      ran                // what the handler left, once committed
	err      error              // nil once committed
	panicked any                // what the handler panicked with; err says so too
}

// handleInBatch is handle in batch mode: the delivery joins the next
// batch and returns once the batch's commit (or its own failure) decided.
func (i *Inbox) handleInBatch(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	obs, ctx, scope, key, err := beginDelivery(i.obs, i.scope, i.config.Key, msg)
	if err != nil {
		return nil, err
	}
	now := i.config.Now()
	d := &delivery{
		h: h, msg: msg, ctx: ctx, obs: obs, scope: scope, key: key,
		id:   scope + "\x00" + repository.StorageKey(key),
		hash: repository.HashPayload(msg.Payload),
		lead: make(chan struct{}),
		done: make(chan struct{}),
	}
	d.claim = repository.ClaimParams{Consumer: scope, Key: key, PayloadHash: d.hash, Now: now, ExpiresAt: now.Add(i.config.Retention)}
	if err := storekit.ValidateClaim(d.claim); err != nil {
		return nil, obs.end(ctx, idempotency.OutcomeFailed, fmt.Errorf("inbox: claim key %q: %w", key, err), nil)
	}
	i.batch.submit(d)
	if d.existing != nil {
		return answer(ctx, obs, protocol.Duplicate(scope, key, d.hash, *d.existing), ran{}, nil)
	}
	var fields watermill.LogFields
	if obs.fields != nil && obs.d.Batch > 0 { // built only for a logger that writes it
		fields = watermill.LogFields{"batch": obs.d.Batch}
	}
	out, err := answer(ctx, obs, protocol.Answer{Kind: protocol.Ran, Err: d.err}, d.ran, fields)
	if d.panicked != nil {
		// Raised on this delivery's own goroutine, once its batch has
		// decided, as the plain inbox raises it: a Recoverer sees a
		// handler's panic whatever the batch limit.
		panic(d.panicked)
	}
	return out, err
}

// submit queues d and returns once d is done, leading batches when its
// turn comes.
func (b *batcher) submit(d *delivery) {
	b.mu.Lock()
	b.pending = append(b.pending, d)
	b.inside++
	if b.capacity > 0 && b.inside > b.capacity {
		b.capacity = b.inside
	}
	first := !b.leading
	if first {
		b.leading = true
		b.full = make(chan struct{})
	} else {
		b.wakeIfComplete()
	}
	b.mu.Unlock()
	if first {
		b.lead(d.ctx)
	}
	lead := d.lead
	for {
		select {
		case <-d.done:
			return
		case <-lead:
			// Closed for good: leading once is all it asks, and select
			// would otherwise pick it again at random beside done.
			lead = nil
			b.lead(d.ctx)
		}
	}
}

// lead collects a batch, passes the collecting on and runs the batch. The
// caller's delivery is the oldest pending one, so it is in the batch; if
// its context ends (the subscriber shutting down), the batch runs at once
// with what it has.
//
// The batch runs when it is complete (see complete) or after MaxWait. A
// MaxWait that runs out teaches the batcher its capacity (see waitedOut).
// Later batches start as soon as that many are inside instead of waiting
// MaxWait again for deliveries that cannot come (River's start
// threshold, learned).
func (b *batcher) lead(ctx context.Context) {
	b.mu.Lock()
	ready := b.complete()
	if !ready && b.full == nil {
		// Complete when the collecting was handed on, no longer now (a
		// running batch committed): wait to be told again.
		b.full = make(chan struct{})
	}
	full := b.full
	b.mu.Unlock()
	if !ready {
		t := time.NewTimer(b.wait)
		select {
		case <-full:
		case <-t.C:
			b.waitedOut()
		case <-ctx.Done():
		}
		t.Stop()
	}

	// A batch not yet full takes its connection first: while the pool
	// has none free, the batch goes on filling (this delivery still
	// collects), instead of every batch queuing for a connection with
	// the few deliveries that came in meanwhile (64 in flight over 2
	// connections, limit 8: 1.9 round trips a delivery against 1.55,
	// docs/benchmarks.md). A full batch is taken at once, so that the
	// next one fills while it waits.
	b.mu.Lock()
	filled := len(b.pending) >= b.limit()
	b.mu.Unlock()
	on, release := b.inbox.beginner, func() {}
	if !filled {
		on, release = b.reserve(context.WithoutCancel(ctx))
	}
	batch := b.take()
	defer b.finished()
	b.run(batch, on, release)
}

// finished counts out a batch that lead ran: one fewer runs, which may
// complete the collecting batch (see complete).
func (b *batcher) finished() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.running--
	b.wakeIfComplete()
}

// take takes the next batch out of the pending deliveries and passes the
// collecting on to the oldest left.
func (b *batcher) take() []*delivery {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch, rest []*delivery
	in := map[string]bool{}
	for _, d := range b.pending {
		// A second copy of a key waits for the next batch, whose claim
		// finds this one's marker: a duplicate.
		if len(batch) < b.limit() && !in[d.id] {
			in[d.id] = true
			batch = append(batch, d)
			continue
		}
		rest = append(rest, d)
	}
	b.pending = rest
	b.running++
	if len(rest) > 0 {
		b.full = make(chan struct{})
		b.wakeIfComplete()
		close(rest[0].lead)
	} else {
		b.leading, b.full = false, nil
	}
	return batch
}

// reserve reserves the connection of the next batch: a beginner on it,
// and release. With no connection to be had, the beginner fails with
// that error: the batch's first attempt fails as a BEGIN on the pool
// would, and run decides what next.
func (b *batcher) reserve(ctx context.Context) (beginner, func()) {
	on, release, err := b.inbox.beginner.reserve(ctx)
	if err != nil {
		return failingBeginner{b.inbox.beginner, fmt.Errorf("reserve a connection: %w", err)}, func() {}
	}
	return on, release
}

// failingBeginner begins nothing: every begin fails with err.
type failingBeginner struct {
	beginner
	err error
}

func (f failingBeginner) beginClaim(context.Context, []repository.ClaimParams) (inboxTx, []repository.Claim, error) {
	return nil, nil, f.err
}

// waitedOut learns from a MaxWait that ran out: every delivery the
// subscribers could hand out was inside by then, or as many as are
// inside now. It lowers the capacity by one at most: a wait also runs out
// while deliveries are on their way (the process scheduled out on a busy
// machine, deliveries acked and handed out again, or taking the plain
// inbox while the batch limit was 1), and a capacity learned too low
// starts every batch as soon as that many are inside, running ones
// included: batches of one or two where dozens were in flight (measured
// at 64 in flight: limit 32, capacity 8, 267 batches for 302
// deliveries). A capacity too high costs a MaxWait, once per delivery
// too many.
func (b *batcher) waitedOut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.capacity = max(b.inside, b.capacity-1)
}

// run runs a batch until every delivery in it is done: committed,
// answered as a duplicate, or failed. A failing handler leaves the batch
// with its error and the others run again without it; a failure nobody
// can be blamed for (the commit, the claim) runs each delivery alone; a
// deadlock or serialization failure runs the batch again.
//
// The first attempt begins on on (a reserved connection, see reserve),
// which release then gives back; any later one on the pool.
func (b *batcher) run(live []*delivery, on beginner, release func()) {
	for attempt := 1; len(live) > 0; attempt++ {
		rest, failed, err := b.attempt(live, on)
		if attempt == 1 {
			release()
		}
		on = b.inbox.beginner
		switch {
		case err == nil:
			return
		case failed != nil:
			b.done(failed.fail(err))
			live = remove(rest, failed)
		case b.retryable(err) && attempt < batchAttempts:
			// A short random pause, so that the batches that collided
			// do not collide again in step.
			time.Sleep(rand.N(time.Duration(attempt) * time.Millisecond))
			live = rest
		case len(rest) > 1:
			b.inbox.config.Logger.Info("Inbox: batch failed, running its deliveries one by one", watermill.LogFields{"batch": len(rest), "err": err})
			for _, d := range rest {
				b.run([]*delivery{d}, b.inbox.beginner, func() {})
			}
			return
		default:
			for _, d := range rest {
				b.done(d.fail(err))
			}
			return
		}
	}
}

// attempt runs live in one transaction. It returns the deliveries still
// undecided (duplicates are answered at once), and on error the
// delivery to blame, if any.
func (b *batcher) attempt(live []*delivery, on beginner) (rest []*delivery, failed *delivery, err error) {
	// Not bound to a delivery's context, for the reason given in
	// Inbox.beginClaim.
	ctx := context.WithoutCancel(live[0].ctx)
	tx, claims, took, err := b.beginClaim(ctx, on, live)
	if err != nil {
		return live, nil, err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback(ctx)
		}
	}()

	for k, d := range live {
		d.obs.d.Claim = took
		if !claims[k].Claimed {
			rec := claims[k].Existing
			d.existing = &rec
			b.done(d)
			continue
		}
		rest = append(rest, d)
	}
	for _, d := range rest {
		if err := b.runOne(tx, d); err != nil {
			if b.retryable(err) || inFailedTx(err) {
				// The transaction was lost under this handler, not by it.
				return rest, nil, err
			}
			return rest, d, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return rest, nil, fmt.Errorf("inbox: commit batch of %d: %w", len(rest), err)
	}
	committed = true
	for _, d := range rest {
		d.obs.d.Batch = len(rest)
	}
	b.done(rest...)
	return nil, nil, nil
}

// beginClaim begins the batch's transaction and claims every delivery's
// key in it with one multi-row claim. took is the claim's time, with
// BEGIN where the two share a round trip. On an error the transaction
// has ended.
func (b *batcher) beginClaim(ctx context.Context, on beginner, live []*delivery) (_ inboxTx, _ []repository.Claim, took time.Duration, _ error) {
	params := make([]repository.ClaimParams, len(live))
	for k, d := range live {
		params[k] = d.claim
	}
	start := time.Now()
	tx, claims, err := on.beginClaim(ctx, params)
	took = time.Since(start)
	if err != nil {
		return nil, nil, took, fmt.Errorf("inbox: claim %d keys: %w", len(live), err)
	}
	return tx, claims, took, nil
}

// runOne runs d's handler on the shared transaction and stores its result
// there, as handle does for a delivery of its own.
func (b *batcher) runOne(tx inboxTx, d *delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			// The panic stays this delivery's: the others of the batch
			// run again without it, and handleInBatch raises it again.
			d.panicked, err = r, fmt.Errorf("inbox: handler panicked: %v", r)
		}
	}()
	r, result, err := b.inbox.runHandler(d.ctx, tx, d.h, d.msg, d.scope, d.key)
	if err == nil {
		err = b.inbox.tx.Save(context.WithoutCancel(d.ctx), tx, d.scope, d.key, result)
	}
	if err != nil {
		return err
	}
	d.ran, d.err = r, nil
	return nil
}

// retryable reports whether err lost the whole transaction to a deadlock
// or a serialization failure, so that running the batch again can help.
func (b *batcher) retryable(err error) bool {
	return b.inbox.beginner.retryable(err) || storekit.IsSerializationFailure(err)
}

// inFailedTx recognises PostgreSQL's "current transaction is aborted"
// (SQLSTATE 25P02): an earlier statement of the batch failed, perhaps in
// a handler that went on as if nothing happened, so the handler that
// meets it is not to blame.
func inFailedTx(err error) bool { return sqldialect.SQLState(err) == "25P02" }

// fail sets d's outcome to err, with nothing committed, and returns d.
func (d *delivery) fail(err error) *delivery {
	d.ran, d.err = ran{}, err
	return d
}

// done hands ds their outcomes: they leave the batcher, and their
// subscribers may hand out new deliveries in their place.
func (b *batcher) done(ds ...*delivery) {
	b.mu.Lock()
	b.inside -= len(ds)
	b.mu.Unlock()
	for _, d := range ds {
		close(d.done)
	}
}

func remove(ds []*delivery, gone *delivery) []*delivery {
	out := make([]*delivery, 0, len(ds))
	for _, d := range ds {
		if d != gone {
			out = append(out, d)
		}
	}
	return out
}
