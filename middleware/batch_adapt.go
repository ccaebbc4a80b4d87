package middleware

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Group commit adapts the size of its batches to what it measures, so
// that it never does worse than a transaction per delivery.
//
// A batch runs its deliveries' handlers one after another on one
// connection: BEGIN, the claim, k handlers' statements and COMMIT, each a
// round trip. It saves commits, round trips and CPU per delivery, which
// wins while the database or the CPU is the bottleneck; it loses when
// round trips are slow (across a network a batch of k takes k+3 of them
// while k deliveries of their own take 3 or 4 each, side by side) or when
// the handler is slow (the batch runs k of them in series).
//
// Both show in one number: the time a delivery spends in the inbox, from
// the middleware's call to its return. The deliveries in flight are
// bounded (router handlers × prefetch), so by Little's law a lower mean
// time is a higher throughput. The policy measures that mean over windows
// of deliveries at each batch limit of a ladder 1, 2, 4, … MaxMessages,
// prefers a smaller limit to a larger one only when the smaller measures
// at least batchAdaptMargin better, keeps to the best, and every
// batchAdaptProbe windows (more after probes that lost) spends one window
// at a neighbour of the best to notice when the load has moved the best.
//
// The search starts where group commit without the policy stays: at
// MaxMessages, for a first window of batchAdaptFirst deliveries; then it
// measures 1, so that a batch that loses is found after two windows, and
// then each neighbour of the best until the best has measured
// neighbours. At 1 a delivery does not enter the batcher at all: it is
// the plain inbox, a transaction of its own.
const (
	// batchAdaptFirst is the first window's deliveries, at MaxMessages.
	batchAdaptFirst = 64
	// batchAdaptWindow is the fewest deliveries a later window holds; a
	// window at limit k holds at least 2k (two batches).
	batchAdaptWindow = 32
	// batchAdaptProbe is how many windows at the best limit come before
	// one at a neighbour, doubled after every probe that lost, up to
	// batchAdaptMaxBackoff times: a probe costs what the neighbour loses.
	batchAdaptProbe      = 8
	batchAdaptMaxBackoff = 3
	// batchAdaptMargin is how much lower a smaller limit's mean time must
	// be to be preferred to a larger one: within it, larger batches win,
	// for the CPU they save (fewer commits and round trips a delivery),
	// which on a shared machine is other processes' throughput. It bounds
	// what the preference can cost: 2 % of the best limit's throughput.
	batchAdaptMargin = 0.02
	// batchAdaptWeight is the weight of a window in its level's estimate
	// while the policy stays at the level: a burst of load elsewhere on
	// the machine moves the estimate by less than its own size.
	batchAdaptWeight = 0.3
)

// batchPolicy chooses the batcher's limit. It has no clock of its own:
// observe is given each delivery's time.
type batchPolicy struct {
	once   sync.Once
	levels []int         // the ladder: 1, 2, 4, …, MaxMessages
	cur    atomic.Int32  // index in levels of the limit in force
	gen    atomic.Uint64 // the window's number

	mu sync.Mutex
	// est is the mean time per delivery measured at each level: an
	// exponentially weighted mean (batchAdaptWeight) of the windows in a
	// row at it, the first after an absence counting alone; 0: not
	// measured yet.
	est     []float64
	sum     time.Duration // the current window's
	n       int           // the current window's deliveries
	windows int           // windows measured
	last    int           // the level of the window before
	since   int           // windows at the best since the last probe
	probes  int           // probes made: even go down, odd go up
	probing bool          // the window was a probe
	warm    bool          // a window at 1 has warmed its connections up
	lost    int           // probes lost in a row, up to batchAdaptMaxBackoff
}

// init builds the ladder up to maxMessages once.
func (p *batchPolicy) init(maxMessages int) {
	p.once.Do(func() {
		for k := 1; k < maxMessages; k *= 2 {
			p.levels = append(p.levels, k)
		}
		p.levels = append(p.levels, maxMessages)
		p.est = make([]float64, len(p.levels))
		p.cur.Store(int32(len(p.levels) - 1))
	})
}

// limit is the most deliveries a batch may hold now.
func (p *batchPolicy) limit() int { return p.levels[p.cur.Load()] }

// window is the number of the window in force, for observe.
func (p *batchPolicy) window() uint64 { return p.gen.Load() }

// observe adds the time in the inbox of a delivery that started in
// window w and, when the window is full, chooses the next limit. A
// delivery that started in an earlier window does not count: it ran,
// or began to wait, under another limit.
func (p *batchPolicy) observe(w uint64, took time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w != p.gen.Load() {
		return
	}
	p.sum += took
	p.n++
	cur := int(p.cur.Load())
	if p.n < p.windowSize(cur) {
		return
	}
	p.windows++
	mean := float64(p.sum) / float64(p.n)
	p.sum, p.n = 0, 0
	if cur == 0 && !p.warm {
		// The first window at 1 warms up what it needs and batches did
		// not: a connection for every delivery in flight, each
		// preparing its statements. It is not the level's time.
		p.warm = true
		p.gen.Add(1)
		return
	}
	if p.est[cur] == 0 || cur != p.last {
		// A level just come back to: its old estimate is stale.
		p.est[cur] = mean
	} else {
		p.est[cur] += batchAdaptWeight * (mean - p.est[cur])
	}
	p.last = cur
	p.cur.Store(int32(p.next(cur)))
	p.gen.Add(1)
}

// windowSize is how many deliveries the window at level cur holds.
func (p *batchPolicy) windowSize(cur int) int {
	if p.windows == 0 {
		return max(batchAdaptFirst, 2*p.levels[cur])
	}
	return max(batchAdaptWindow, 2*p.levels[cur])
}

// next is the level of the next window, after a window at cur. p.mu is
// held.
func (p *batchPolicy) next(cur int) int {
	if p.est[0] == 0 {
		return 0
	}
	// The best level: a smaller one only if clearly better.
	best := -1
	for l := len(p.est) - 1; l >= 0; l-- {
		if e := p.est[l]; e > 0 && (best < 0 || e < p.est[best]*(1-batchAdaptMargin)) {
			best = l
		}
	}
	// Measure the best's neighbours before keeping to it.
	for _, l := range []int{best - 1, best + 1} {
		if l >= 0 && l < len(p.levels) && p.est[l] == 0 {
			return l
		}
	}
	if cur != best {
		// Back from a probe (or the best moved): a probe that lost
		// makes the next one come twice as late, up to
		// batchAdaptMaxBackoff doublings.
		if p.probing && p.lost < batchAdaptMaxBackoff {
			p.lost++
		}
		p.probing, p.since = false, 0
		return best
	}
	if p.probing {
		p.lost = 0 // the probe won: probe as often as at first
	}
	p.probing = false
	p.since++
	if p.since < batchAdaptProbe<<p.lost {
		return best
	}
	p.since = 0
	p.probes++
	p.probing = true
	down, up := best-1, best+1
	if p.probes%2 == 1 {
		down, up = up, down
	}
	for _, l := range []int{down, up} {
		if l >= 0 && l < len(p.levels) {
			return l
		}
	}
	return best
}

// handleBatched is handle in batch mode: at limit 1 the plain inbox
// (handle), otherwise the delivery joins the next batch (handleInBatch);
// either way its time goes to the policy.
func (i *Inbox) handleBatched(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if i.batch.fixed {
		return i.handleInBatch(h, msg)
	}
	// The window first: a limit read after it is the window's or a
	// later one's, and a delivery of a later one is not counted.
	w := i.batch.policy.window()
	limit, start := i.batch.limit(), time.Now()
	var out []*message.Message
	var err error
	if limit == 1 {
		out, err = i.handle(h, msg)
	} else {
		out, err = i.handleInBatch(h, msg)
	}
	i.batch.policy.observe(w, time.Since(start))
	return out, err
}

// limit is the most deliveries the collecting batch may hold: the
// policy's limit, or max with BatchConfig.Fixed.
func (b *batcher) limit() int {
	if b.fixed {
		return b.max
	}
	b.policy.init(b.max)
	return b.policy.limit()
}
