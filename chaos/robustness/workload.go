package robustness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemkit/watermill-idempotent/repository"
)

// Store is what the workload drives: the two-phase contract and Get.
type Store interface {
	repository.TwoPhase
	repository.Reader
}

// TxStore is the transactional contract of a SQL store, on its database.
type TxStore struct {
	DB   *sql.DB
	Repo repository.Driver[*sql.Tx]
}

// Workload shapes the traffic of one run.
type Workload struct {
	// Clients is the number of concurrent clients; default 6.
	Clients int
	// Keys is the number of keys the clients share at a time; default 3.
	// Every Generation the clients move to fresh keys, which keeps each
	// key's history short enough to check exhaustively.
	Keys int
	// Generation is how long a set of keys is used; default 400ms.
	Generation time.Duration
	// Lease is the lease each claim takes; default 30ms, short enough that
	// leases run out and are reclaimed during a run.
	Lease time.Duration
	// OpTimeout bounds each call; a call that times out has an unknown
	// outcome. Default 2s.
	OpTimeout time.Duration
	// Pause is the most a client waits between calls (uniformly random),
	// so fast stores do not produce histories too long to check; default
	// 2ms.
	Pause time.Duration
	// Backoff is how long a client waits after a call failed; default
	// 100ms.
	Backoff time.Duration
	// Consumer scopes the keys; default "robust".
	Consumer string
}

func (w *Workload) setDefaults() {
	if w.Clients <= 0 {
		w.Clients = 6
	}
	if w.Keys <= 0 {
		w.Keys = 3
	}
	if w.Generation <= 0 {
		w.Generation = 400 * time.Millisecond
	}
	if w.Lease <= 0 {
		w.Lease = 30 * time.Millisecond
	}
	if w.OpTimeout <= 0 {
		w.OpTimeout = 2 * time.Second
	}
	if w.Pause <= 0 {
		w.Pause = 2 * time.Millisecond
	}
	if w.Backoff <= 0 {
		w.Backoff = 100 * time.Millisecond
	}
	if w.Consumer == "" {
		w.Consumer = "robust"
	}
}

// infinite is the return time of a call with an unknown outcome.
const infinite = math.MaxInt64

// Record runs w's clients against store until ctx ends and returns every
// call as a porcupine operation. Call and return times are nanoseconds
// since the run began on the monotonic clock; a call whose outcome is
// unknown has return time math.MaxInt64 — even a refused connection,
// since a client library may have sent the call once before it retried.
//
// With tx set (a SQL store), a fifth of the rounds are transactional
// claims on the same keys instead of two-phase ones.
func (w Workload) Record(ctx context.Context, store Store, tx *TxStore) []porcupine.Operation {
	w.setDefaults()
	start := time.Now()
	run := fmt.Sprintf("%x", rand.Uint32())
	histories := make([][]porcupine.Operation, w.Clients)
	var wg sync.WaitGroup
	for i := range w.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &client{id: i, w: w, store: store, tx: tx, start: start, run: run}
			c.loop(ctx)
			histories[i] = c.history
		}()
	}
	wg.Wait()
	var all []porcupine.Operation
	for _, h := range histories {
		all = append(all, h...)
	}
	return all
}

type client struct {
	id    int
	w     Workload
	store Store
	tx    *TxStore
	start time.Time
	run   string
	seq   int
	// stale is an owner this client held earlier, used to check that a
	// lost lease stays lost.
	stale   string
	history []porcupine.Operation
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func (c *client) key() string {
	gen := int64(time.Since(c.start) / c.w.Generation)
	return fmt.Sprintf("%s-g%d-k%d", c.run, gen, rand.N(c.w.Keys))
}

func (c *client) owner() string {
	c.seq++
	return fmt.Sprintf("c%d.%d", c.id, c.seq)
}

// loop plays the two-phase protocol as the library's entry points do,
// with the detours that test fencing: claim (or reclaim an expired
// lease), maybe extend, then complete, release, or walk away and let
// the lease run out; now and then a read, or a call with an owner that
// lost its lease.
func (c *client) loop(ctx context.Context) {
	for ctx.Err() == nil {
		key, owner := c.key(), c.owner()
		now := time.Now()
		if c.tx != nil && rand.N(5) == 0 {
			c.call(ctx, Input{Kind: Claim, Key: key, Now: ms(now), ExpiresAt: ms(now.Add(time.Hour)), Result: "t-" + owner})
			c.pause(ctx)
			continue
		}
		acq, known := c.call(ctx, Input{Kind: Acquire, Key: key, Owner: owner,
			Now: ms(now), LeaseUntil: ms(now.Add(c.w.Lease)), ExpiresAt: ms(now.Add(time.Hour))})
		held := known && acq.OK
		if known && !acq.OK && acq.Record.State == "in_progress" && acq.Record.Owner != owner && acq.Record.LeaseUntil <= ms(time.Now()) {
			now := time.Now()
			rec, known := c.call(ctx, Input{Kind: Reclaim, Key: key, PrevOwner: acq.Record.Owner, Owner: owner,
				Now: ms(now), LeaseUntil: ms(now.Add(c.w.Lease))})
			held = known && rec.OK
		}
		c.pause(ctx)
		if rand.N(4) == 0 {
			c.call(ctx, Input{Kind: Get, Key: key, Now: ms(time.Now())})
		}
		if c.stale != "" && rand.N(6) == 0 {
			c.call(ctx, Input{Kind: Complete, Key: key, Owner: c.stale, Result: "r-" + c.stale})
		}
		if !held {
			c.pause(ctx)
			continue
		}
		if rand.N(3) == 0 {
			c.call(ctx, Input{Kind: Extend, Key: key, Owner: owner, LeaseUntil: ms(time.Now().Add(c.w.Lease))})
		}
		c.pause(ctx)
		switch n := rand.N(10); {
		case n < 5:
			c.call(ctx, Input{Kind: Complete, Key: key, Owner: owner, Result: "r-" + owner})
		case n < 8:
			c.call(ctx, Input{Kind: Release, Key: key, Owner: owner})
		default:
			c.stale = owner // walks away: the lease runs out
		}
		c.pause(ctx)
	}
}

func (c *client) pause(ctx context.Context) {
	t := time.NewTimer(rand.N(c.w.Pause) + time.Microsecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// call runs in against the store, records it, and returns the answer and
// whether it is known.
func (c *client) call(ctx context.Context, in Input) (Output, bool) {
	if ctx.Err() != nil {
		return Output{}, false
	}
	octx, cancel := context.WithTimeout(ctx, c.w.OpTimeout)
	defer cancel()
	call := time.Since(c.start).Nanoseconds()
	var out Output
	var err error
	if in.Kind == Claim {
		out, err = claim(octx, c.tx, c.w.Consumer, in)
	} else {
		out, err = invoke(octx, c.store, c.w.Consumer, in)
	}
	ret := time.Since(c.start).Nanoseconds()
	if err != nil {
		out, ret = Output{Unknown: true, Err: shorten(err.Error())}, infinite
	}
	c.history = append(c.history, porcupine.Operation{ClientId: c.id, Input: in, Call: call, Output: out, Return: ret})
	if err != nil {
		// Back off while the store is down: every failed call is one
		// more unknown outcome for the checker to place.
		t := time.NewTimer(c.w.Backoff)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return out, err == nil
}

// invoke makes the store call in describes and turns the answer into an
// Output; err is an error outside the contract (the outcome is unknown).
func invoke(ctx context.Context, s Store, consumer string, in Input) (Output, error) {
	t := func(v int64) time.Time { return time.UnixMilli(v).UTC() }
	switch in.Kind {
	case Acquire:
		a, err := s.Acquire(ctx, repository.AcquireParams{Consumer: consumer, Key: in.Key, Owner: in.Owner,
			PayloadHash: []byte("p"), Now: t(in.Now), LeaseUntil: t(in.LeaseUntil), ExpiresAt: t(in.ExpiresAt)})
		if err != nil {
			return Output{}, err
		}
		if a.Acquired {
			return Output{OK: true}, nil
		}
		return Output{Record: view(a.Existing)}, nil
	case Reclaim:
		rec, err := s.Reclaim(ctx, repository.ReclaimParams{Consumer: consumer, Key: in.Key, PrevOwner: in.PrevOwner,
			Owner: in.Owner, Now: t(in.Now), LeaseUntil: t(in.LeaseUntil)})
		if errors.Is(err, repository.ErrLeaseLost) {
			return Output{}, nil
		}
		if err != nil {
			return Output{}, err
		}
		return Output{OK: true, Record: view(rec)}, nil
	case Get:
		rec, err := s.Get(ctx, consumer, in.Key)
		if errors.Is(err, repository.ErrNotFound) {
			return Output{}, nil
		}
		if err != nil {
			return Output{}, err
		}
		return Output{Found: true, Record: view(rec)}, nil
	}
	var err error
	switch in.Kind {
	case Extend:
		err = s.Extend(ctx, repository.LeaseParams{Consumer: consumer, Key: in.Key, Owner: in.Owner, LeaseUntil: t(in.LeaseUntil)})
	case Complete:
		err = s.Complete(ctx, repository.CompleteParams{Consumer: consumer, Key: in.Key, Owner: in.Owner,
			Result: []byte(in.Result), Now: time.Now()})
	case Release:
		err = s.Release(ctx, repository.LeaseParams{Consumer: consumer, Key: in.Key, Owner: in.Owner})
	default:
		return Output{}, fmt.Errorf("robustness: unknown operation %q", in.Kind)
	}
	if errors.Is(err, repository.ErrLeaseLost) {
		return Output{}, nil
	}
	return Output{OK: err == nil}, err
}

// claim runs the transactional protocol's storage calls in one
// transaction: Claim, SaveResult when claimed, commit. An error at
// any step rolls back; one at the commit leaves the outcome unknown, so
// every error is treated as unknown.
func claim(ctx context.Context, s *TxStore, consumer string, in Input) (Output, error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return Output{}, err
	}
	defer func() { _ = tx.Rollback() }()
	cs, err := s.Repo.Claim(ctx, tx, []repository.ClaimParams{{Consumer: consumer, Key: in.Key, PayloadHash: []byte("p"),
		Now: time.UnixMilli(in.Now).UTC(), ExpiresAt: time.UnixMilli(in.ExpiresAt).UTC()}})
	if err != nil {
		return Output{}, err
	}
	c := cs[0]
	if !c.Claimed {
		return Output{Record: view(c.Existing)}, tx.Commit()
	}
	if err := s.Repo.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: consumer, Key: in.Key, Result: []byte(in.Result)}); err != nil {
		return Output{}, err
	}
	return Output{OK: true}, tx.Commit()
}

// view is the part of rec the model checks.
func view(rec repository.Record) View {
	v := View{State: string(rec.State), Owner: rec.LeaseOwner, Attempts: rec.Attempts, Result: string(rec.Result)}
	if rec.State == repository.StateInProgress {
		v.LeaseUntil = rec.LeaseUntil.UnixMilli()
	}
	return v
}

func shorten(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
