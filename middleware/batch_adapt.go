package middleware

import (
	"math"
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
// Both show in one number: the deliveries the inbox completes per second
// of wall-clock time, measured over windows of deliveries at each batch
// limit of a ladder 1, 2, 4, … MaxMessages. (The time a delivery spends
// in the inbox, measured before, misses what small batches cost outside
// it: where the process, the router and the database share a few cores,
// the CPU small batches spend slows the router's goroutines, fewer
// deliveries are inside at once, and each takes less time in the inbox
// while fewer complete per second.) A window's clock starts once every
// delivery that started under an earlier limit has left the inbox, so
// that the window measures its own limit alone, and it counts only the
// deliveries that started in it.
//
// The load on a shared machine moves a window's rate by more than the
// limits differ, and it drifts, so a limit is only ever compared with
// the best limit's windows on either side of it: a probe is the window
// at the best before it, one at a neighbour, and one at the best after
// it; the neighbour becomes the best only if its rate beats the mean of
// the two around it by batchAdaptMargin and by batchAdaptSure times the
// noise measured between windows at the best (a drift that is linear over
// the three windows cancels out).
//
// The search starts where group commit without the policy stays: at
// MaxMessages, whose first window warms up connections and statements
// and is not measured. The first probe goes to 1 (a window at 1 to warm
// up a connection for every delivery in flight, one measured), so that a
// batch that loses is found after four windows: a first probe that
// completes twice as many deliveries a second as the window at
// MaxMessages before it wins at once, without the window after it (at
// MaxMessages, where batches lose by that much, the dearest window of
// the search; no drift or noise doubles a rate from one window to the
// next but one). From then on it probes
// neighbours: back to back while they win (explore), in the direction
// of the last win, and then every batchAdaptProbe windows at the best
// (more after probes that lost), alternately below and above, to notice
// when the load has moved the best. At 1 a delivery does not enter the
// batcher at all: it is the plain inbox, a transaction of its own.
const (
	// batchAdaptWindow is the fewest deliveries a window holds; a
	// window at limit k holds at least 2k (two batches).
	batchAdaptWindow = 32
	// batchAdaptProbe is how many windows at the best limit come between
	// probes, doubled after every probe that lost, up to
	// batchAdaptMaxBackoff times: a probe costs what the neighbour loses.
	batchAdaptProbe      = 8
	batchAdaptMaxBackoff = 3
	// batchAdaptMargin is how much more a neighbour must complete per
	// second than the best around it to become the best: it keeps the
	// window noise from moving the best back and forth; on a quiet
	// machine it bounds what staying can cost: 5 % of the neighbour's
	// throughput (see batchAdaptSure for a busy one). The search
	// starts at MaxMessages, so within it larger batches stay, for the
	// CPU they save (fewer commits and round trips a delivery).
	batchAdaptMargin = 0.05
	// batchAdaptSure is how many of the window noise's standard
	// deviations a probe's gain must exceed, beyond the margin, to win.
	// The noise is measured: the change from one window at the best to
	// the next. Where the machine is busy it is as large as what the
	// limits differ by (±40 % at load 20 on two cores), and only a
	// neighbour that is clearly better wins; one that completes twice
	// as many always does.
	batchAdaptSure = 1.5
	// batchAdaptNoiseWeight is a window's weight in the noise estimate.
	batchAdaptNoiseWeight = 0.2
)

// The phases of the policy's windows.
const (
	atBest   = iota // at the best: a window before a probe
	probing         // at the neighbour probed
	backAtIt        // at the best again, after the probe
)

// batchPolicy chooses the batcher's limit. It has no clock of its own:
// leave is given the time.
type batchPolicy struct {
	once   sync.Once
	levels []int        // the ladder: 1, 2, 4, …, MaxMessages
	cur    atomic.Int32 // index in levels of the limit in force

	mu     sync.Mutex
	gen    uint64 // the window's number
	inside int    // deliveries in the inbox, of any window
	// older is how many of them started in an earlier window; the
	// window's clock starts when the last of them leaves.
	older   int
	from    time.Time // the window's clock started; zero: not yet
	n       int       // the window's deliveries counted since from
	windows int       // windows closed

	best   int     // the best level
	phase  int     // atBest, probing, backAtIt
	probe  int     // the level probed
	before float64 // the rate at the best in the window before the probe
	rate   float64 // the probe's rate
	// last is the rate of the last window at the best, 0 after the best
	// changed; noise is the mean square of the logarithm of the change
	// from one such window to the next: twice the variance of a window's
	// logarithm.
	last, noise float64
	samples     int // in noise
	// explore is the direction (-1 down, +1 up) in which probes go back
	// to back, after a probe won or at the start; 0: one probe every
	// batchAdaptProbe<<lost windows.
	explore int
	first   bool // the probe is the first, from MaxMessages to 1
	since   int  // windows at the best since the last probe
	probes  int  // periodic probes made: odd go down, even up
	warm    bool // a window at 1 has warmed its connections up
	lost    int  // probes lost in a row, up to batchAdaptMaxBackoff
}

// init builds the ladder up to maxMessages once.
func (p *batchPolicy) init(maxMessages int) {
	p.once.Do(func() {
		for k := 1; k < maxMessages; k *= 2 {
			p.levels = append(p.levels, k)
		}
		p.levels = append(p.levels, maxMessages)
		p.best = len(p.levels) - 1
		p.cur.Store(int32(p.best))
	})
}

// limit is the most deliveries a batch may hold now.
func (p *batchPolicy) limit() int { return p.levels[p.cur.Load()] }

// enter counts a delivery into the inbox and returns its window, for
// leave, and the limit in force.
func (p *batchPolicy) enter() (w uint64, limit int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inside++
	return p.gen, p.limit()
}

// leave counts out a delivery that entered in window w and left the
// inbox at now and, when the window is full, chooses the next limit. A
// delivery of an earlier window does not count: it ran, or began to
// wait, under another limit; the window's clock starts when the last of
// them has left.
func (p *batchPolicy) leave(w uint64, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inside--
	if w != p.gen {
		if p.older--; p.older == 0 {
			p.from = now
		}
		return
	}
	if p.older > 0 {
		return
	}
	if p.from.IsZero() {
		// The first window: its clock starts at its first delivery out.
		p.from = now
		return
	}
	p.n++
	cur := int(p.cur.Load())
	if p.n < p.windowSize(cur) {
		return
	}
	p.windows++
	rate := float64(p.n) / max(now.Sub(p.from), time.Nanosecond).Seconds()
	p.n = 0
	p.gen++
	// Whoever is still inside started in the window just closed.
	if p.older = p.inside; p.older == 0 {
		p.from = now
	}
	p.cur.Store(int32(p.next(cur, rate)))
}

// windowSize is how many deliveries the window at level cur counts.
func (p *batchPolicy) windowSize(cur int) int {
	return max(batchAdaptWindow, 2*p.levels[cur])
}

// next is the level of the next window, after a window at cur that
// completed rate deliveries a second. p.mu is held.
func (p *batchPolicy) next(cur int, rate float64) int {
	switch {
	case p.windows == 1:
		// The first window warms up what batches need (connections
		// opened, statements prepared): not MaxMessages' rate. The
		// first probe, to 1, comes after the next.
		p.explore = -1
		return p.best
	case cur == 0 && !p.warm:
		// The first window at 1 warms up what single deliveries need
		// besides: a connection for every delivery in flight.
		p.warm = true
		return cur
	}
	switch p.phase {
	case probing:
		p.rate, p.phase = rate, backAtIt
		if p.first && rate >= 2*p.before {
			// The first probe doubled the rate: it wins now (see
			// above).
			return p.adopt()
		}
		return p.best
	case backAtIt:
		p.sample(rate)
		// The gain's variance: a window's, plus half a window's for
		// the mean of the two around it.
		won := math.Log(p.rate/((p.before+rate)/2)) > min(math.Log1p(batchAdaptMargin)+batchAdaptSure*math.Sqrt(0.75*p.noise), math.Ln2)
		p.since = 1
		switch {
		case won:
			return p.adopt()
		case p.first:
			// The first probe lost: batches win, look for the best
			// of them below MaxMessages.
			p.first, p.explore = false, -1
		case p.explore != 0:
			p.explore = 0 // the best's neighbours in that direction lose
		default:
			p.lost = min(p.lost+1, batchAdaptMaxBackoff)
		}
		p.phase = atBest
		// The window just closed is the best's: a probe may follow.
	default:
		p.sample(rate)
		p.since++
	}
	if l := p.nextProbe(); l >= 0 {
		p.before, p.probe, p.phase = rate, l, probing
		return l
	}
	return p.best
}

// adopt makes the probed level the best, after its probe won, and
// returns it. p.mu is held.
func (p *batchPolicy) adopt() int {
	// Go on in the probe's direction; from 1 after the first probe, up.
	p.explore = 1
	if p.probe < p.best && !p.first {
		p.explore = -1
	}
	p.best, p.lost, p.first, p.last = p.probe, 0, false, 0
	// Its window before the next probe is yet to come.
	p.phase = atBest
	return p.best
}

// sample adds a window at the best to the noise estimate. p.mu is held.
func (p *batchPolicy) sample(rate float64) {
	if p.last > 0 {
		d := math.Log(rate / p.last)
		if p.samples++; p.samples == 1 {
			p.noise = d * d
		} else {
			p.noise += batchAdaptNoiseWeight * (d*d - p.noise)
		}
	}
	p.last = rate
}

// nextProbe is the level to probe after a window at the best, or -1 to
// stay. p.mu is held.
func (p *batchPolicy) nextProbe() int {
	if p.windows == 2 { // the window after the one that warmed up
		p.first = true
		return 0
	}
	if p.explore != 0 {
		if l := p.best + p.explore; l >= 0 && l < len(p.levels) {
			return l
		}
		p.explore = 0
	}
	if p.since < batchAdaptProbe<<p.lost {
		return -1
	}
	p.since = 0
	p.probes++
	down, up := p.best-1, p.best+1
	if p.probes%2 == 0 {
		down, up = up, down
	}
	for _, l := range []int{down, up} {
		if l >= 0 && l < len(p.levels) {
			return l
		}
	}
	return -1
}

// handleBatched is handle in batch mode: at limit 1 the plain inbox
// (handle), otherwise the delivery joins the next batch (handleInBatch);
// either way the policy counts it in and out.
func (i *Inbox) handleBatched(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	if i.batch.fixed {
		return i.handleInBatch(h, msg)
	}
	i.batch.policy.init(i.batch.max)
	w, limit := i.batch.policy.enter()
	// Deferred: a handler's panic that leaves the inbox still leaves it.
	defer func() { i.batch.policy.leave(w, time.Now()) }()
	if limit == 1 {
		return i.handle(h, msg)
	}
	return i.handleInBatch(h, msg)
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
