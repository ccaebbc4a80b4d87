package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Fault kinds, in the order the table lists them.
const (
	faultWorkerKill      = "worker SIGKILL"
	faultExitAfterCommit = "worker exit after commit, before ack"
	faultRelayKill       = "relay SIGKILL"
	faultTerminate       = "connections terminated (pg_terminate_backend)"
	faultListenKill      = "LISTEN connection terminated"
	faultRestartFast     = "PostgreSQL restart (fast shutdown)"
	faultRestartCrash    = "PostgreSQL restart (immediate: crash recovery)"
	faultUnexpectedExit  = "child ended by itself (restarted)"
)

var faultOrder = []string{
	faultWorkerKill, faultExitAfterCommit, faultRelayKill, faultTerminate,
	faultListenKill, faultRestartFast, faultRestartCrash, faultUnexpectedExit,
}

// faultCounter counts injected faults by kind, with free-form notes.
type faultCounter struct {
	mu        sync.Mutex
	counts    map[string]int
	backends  map[string]int // backends terminated, by fault kind
	notes     []string
	maxNotes  int
	droppedNo int
}

func newFaultCounter() *faultCounter {
	return &faultCounter{counts: map[string]int{}, backends: map[string]int{}, maxNotes: 20}
}

func (f *faultCounter) add(kind string, n int) {
	f.mu.Lock()
	f.counts[kind] += n
	f.mu.Unlock()
}

func (f *faultCounter) addBackends(kind string, n int) {
	f.mu.Lock()
	f.backends[kind] += n
	f.mu.Unlock()
}

func (f *faultCounter) note(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.notes) < f.maxNotes {
		f.notes = append(f.notes, s)
	} else {
		f.droppedNo++
	}
}

func (f *faultCounter) snapshot() (counts, backends map[string]int, notes []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	counts = make(map[string]int, len(f.counts))
	for k, v := range f.counts {
		counts[k] = v
	}
	backends = make(map[string]int, len(f.backends))
	for k, v := range f.backends {
		backends[k] = v
	}
	notes = append([]string(nil), f.notes...)
	if f.droppedNo > 0 {
		notes = append(notes, fmt.Sprintf("… and %d more", f.droppedNo))
	}
	return counts, backends, notes
}

// injector deals faults from a shuffled deck, so every kind in the deck
// is injected once before any is injected twice.
type injector struct {
	cluster  cluster
	admin    *sql.DB // private cluster, application_name chaos-admin
	workers  []*proc
	relay    *proc // nil in the two-phase phase
	faults   *faultCounter
	every    time.Duration
	kinds    []string
	progress func(string)
	// dealt is closed once the first deck has been dealt: every kind
	// injected at least once.
	dealt chan struct{}
}

func (in *injector) run(ctx context.Context) error {
	var deck []string
	decks := 0
	for {
		wait := in.every/2 + rand.N(in.every)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		if len(deck) == 0 {
			if decks++; decks == 2 {
				close(in.dealt)
			}
			deck = append(deck, in.kinds...)
			rand.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		kind := deck[0]
		ok, err := in.inject(ctx, kind)
		if err != nil {
			return err
		}
		if ok {
			deck = deck[1:]
			in.progress(kind + ": injected")
		} else {
			in.progress(kind + ": nothing to hit, retrying")
		}
		// A fault that found nothing to hit (a LISTEN connection still
		// reconnecting, a worker between lives) stays on top of the deck.
	}
}

func (in *injector) inject(ctx context.Context, kind string) (bool, error) {
	switch kind {
	case faultWorkerKill:
		if in.workers[rand.N(len(in.workers))].kill() {
			in.faults.add(kind, 1)
			return true, nil
		}
	case faultRelayKill:
		if in.relay.kill() {
			in.faults.add(kind, 1)
			return true, nil
		}
	case faultTerminate:
		// Every connection of the children, or a random half of them.
		n, err := in.terminate(ctx, `application_name LIKE 'chaos-%' AND application_name <> 'chaos-admin' AND random() < $1::float8`, []float64{1, 0.5}[rand.N(2)])
		if err == nil && n > 0 {
			in.faults.add(kind, 1)
			in.faults.addBackends(kind, n)
			return true, nil
		}
	case faultListenKill:
		n, err := in.terminate(ctx, `query LIKE 'LISTEN %' AND $1::float8 = 1`, 1)
		if err == nil && n > 0 {
			in.faults.add(kind, 1)
			in.faults.addBackends(kind, n)
			return true, nil
		}
	case faultRestartFast, faultRestartCrash:
		mode := "fast"
		if kind == faultRestartCrash {
			mode = "immediate"
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := in.cluster.restart(rctx, mode); err != nil {
			return false, err
		}
		in.faults.add(kind, 1)
		// Let the children meet the new server before the next fault.
		if err := waitReady(rctx, in.admin, "the private cluster after a restart"); err != nil {
			return false, err
		}
		return true, nil
	default:
		return false, fmt.Errorf("chaos: unknown fault %q", kind)
	}
	return false, nil
}

// terminate ends the backends matching where (over pg_stat_activity of
// the private cluster's database, never this connection) and returns how
// many it ended. An error (the server restarting) injects nothing.
func (in *injector) terminate(ctx context.Context, where string, arg float64) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var n int
	err := in.admin.QueryRowContext(qctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND `+where, arg).Scan(&n)
	return n, err
}
