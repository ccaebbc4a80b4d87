package middleware

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// inFlight is how many deliveries drive keeps in the inbox at once.
const inFlight = 8

// sim is a closed loop of inFlight deliveries in the inbox, each that
// leaves replaced at once by a new one, on a synthetic clock.
type sim struct {
	p     *batchPolicy
	clock time.Time
	in    []simDelivery // oldest first
}

type simDelivery struct {
	w uint64
	k int
}

// drive runs the loop until windows more windows have closed and
// returns each one's limit. A delivery that entered at limit k leaves
// cost(k)/inFlight after the one before it: inFlight/cost(k) deliveries
// a second, cost(k) being each one's time in the inbox.
func drive(s *sim, maxMessages, windows int, cost func(k int) time.Duration) []int {
	s.p.init(maxMessages)
	if s.clock.IsZero() {
		s.clock = time.Unix(1e9, 0)
	}
	for len(s.in) < inFlight {
		s.enter()
	}
	var limits []int
	for len(limits) < windows {
		d := s.in[0]
		s.in = s.in[1:]
		s.clock = s.clock.Add(cost(d.k) / inFlight)
		k, before := s.p.limit(), s.p.windows
		s.p.leave(d.w, s.clock)
		if s.p.windows != before {
			limits = append(limits, k)
		}
		s.enter()
	}
	return limits
}

func newSim() *sim { return &sim{p: &batchPolicy{}} }

func (s *sim) enter() {
	w, k := s.p.enter()
	s.in = append(s.in, simDelivery{w, k})
}

// share is the fraction of limits equal to k.
func share(limits []int, k int) float64 {
	n := 0
	for _, l := range limits {
		if l == k {
			n++
		}
	}
	return float64(n) / float64(len(limits))
}

func TestBatchPolicyLadder(t *testing.T) {
	for _, tc := range []struct {
		max  int
		want []int
	}{
		{2, []int{1, 2}},
		{8, []int{1, 2, 4, 8}},
		{12, []int{1, 2, 4, 8, 12}},
		{1000, []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000}},
	} {
		var p batchPolicy
		p.init(tc.max)
		require.Equal(t, tc.want, p.levels)
		require.Equal(t, tc.max, p.limit(), "the search starts where group commit without it stays")
	}
}

// Across a network each statement of a batch is a round trip in series:
// a batch of k takes k+3 of them, a delivery on its own 4. The policy
// ends at 1 and stays there but for its probes.
func TestBatchPolicyShrinksWhenRoundTripsAreSlow(t *testing.T) {
	s := newSim()
	limits := drive(s, 8, 60, func(k int) time.Duration { return time.Duration(k+3) * time.Millisecond })
	require.Equal(t, []int{8, 8, 1, 1, 1, 2, 1}, limits[:7],
		"MaxMessages (to warm up, then before the probe), 1 (a window to warm up, one to measure); 1 more than doubled the rate and won at once: its neighbour, between two windows at 1")
	steady := limits[7:]
	require.GreaterOrEqual(t, share(steady, 1), float64(batchAdaptProbe)/(batchAdaptProbe+1)-0.01, "limits %v", steady)
	require.Subset(t, []int{1, 2}, steady, "a probe goes to a neighbour of the best only")

	// Every probe loses: each comes twice as late as the one before, up
	// to batchAdaptMaxBackoff doublings.
	steady = append(steady, drive(s, 8, 400, func(k int) time.Duration { return time.Duration(k+3) * time.Millisecond })...)
	var gaps []int
	last := -1
	for w, k := range steady {
		if k != 1 {
			if last >= 0 {
				gaps = append(gaps, w-last-1)
			}
			last = w
		}
	}
	require.GreaterOrEqual(t, len(gaps), 4, "limits %v", steady)
	require.True(t, slices.IsSorted(gaps), "gaps between probes %v", gaps)
	require.Equal(t, batchAdaptProbe<<batchAdaptMaxBackoff, gaps[len(gaps)-1], "gaps between probes %v", gaps)
}

// A first probe that wins by less than twice the rate is compared with
// the windows on either side of it, as every other probe is.
func TestBatchPolicyFirstProbeWinsAtOnceOnlyByTwice(t *testing.T) {
	// 1 completes 1.5 times as many deliveries a second as 8.
	limits := drive(newSim(), 8, 8, func(k int) time.Duration { return time.Millisecond + time.Duration(k-1)*time.Millisecond/14 })
	require.Equal(t, []int{8, 8, 1, 1, 8, 1, 2, 1}, limits,
		"MaxMessages, 1 (warm up, measure), MaxMessages after it; 1 won: its neighbour, between two windows at 1")
}

// A slow handler: a batch runs k of them in series.
func TestBatchPolicyShrinksWhenTheHandlerIsSlow(t *testing.T) {
	s := newSim()
	limits := drive(s, 32, 60, func(k int) time.Duration { return time.Duration(k)*10*time.Millisecond + time.Millisecond })
	require.GreaterOrEqual(t, share(limits[10:], 1), 0.85, "limits %v", limits)
}

// Where the database is the bottleneck, sharing commits lowers every
// delivery's time up to a point: the policy finds the best batch.
func TestBatchPolicyGrowsWhereBatchesWin(t *testing.T) {
	s := newSim()
	// Best at 8 (100/8 + 8 = 20.5 against 29 at 4 and 22.25 at 16).
	limits := drive(s, 32, 80, func(k int) time.Duration {
		return time.Duration(100/float64(k)+float64(k)) * time.Millisecond
	})
	steady := limits[len(limits)-45:]
	require.GreaterOrEqual(t, share(steady, 8), 0.85, "limits %v", limits)
	require.Subset(t, []int{4, 8, 16}, steady)
}

// Within batchAdaptMargin a larger batch is preferred, for the CPU it
// saves.
func TestBatchPolicyPrefersLargerBatchesWhenEven(t *testing.T) {
	s := newSim()
	limits := drive(s, 16, 50, func(k int) time.Duration { return 100*time.Millisecond + time.Duration(k)*time.Microsecond })
	require.GreaterOrEqual(t, share(limits[10:], 16), 0.85, "limits %v", limits)
}

// When the load changes the best, the probes find the new one.
func TestBatchPolicyFollowsAChangeOfLoad(t *testing.T) {
	s := newSim()
	bigWins := func(k int) time.Duration { return time.Duration(100/float64(k)+float64(k)) * time.Millisecond }
	limits := drive(s, 32, 60, bigWins)
	require.Equal(t, 8, limits[len(limits)-1], "limits %v", limits)
	// Now round trips are slow: every level's time grows with k, and
	// the old estimates are stale.
	slow := func(k int) time.Duration { return time.Duration(k+3) * 10 * time.Millisecond }
	limits = drive(s, 32, 150, slow)
	require.GreaterOrEqual(t, share(limits[len(limits)-40:], 1), 0.8, "limits %v", limits)
	require.Equal(t, 1, slices.Min(limits))
}

// A window counts only its own deliveries, and its clock starts when
// the last delivery of an earlier window has left: a straggler that sat
// in the inbox for a second, under another limit, moves neither.
func TestBatchPolicyClockStartsWhenEarlierDeliveriesLeave(t *testing.T) {
	var p batchPolicy
	p.init(8)
	clock := time.Unix(1e9, 0)
	one := func() {
		w, _ := p.enter()
		clock = clock.Add(time.Millisecond)
		p.leave(w, clock)
	}
	for p.limit() == 8 { // the first window warms up, the second measures
		one()
	}
	require.Equal(t, 2, p.windows, "then the first probe, to 1")
	straggler, _ := p.enter()
	for p.windows < 3 { // the window that warms 1 up
		one()
	}
	require.Equal(t, 1, p.limit(), "then 1 is measured")
	for range 100 {
		one()
	}
	require.Zero(t, p.n, "the window waits for the straggler")
	clock = clock.Add(time.Second)
	p.leave(straggler, clock)
	for p.windows < 4 {
		one()
	}
	require.InDelta(t, 1000, p.rate, 1, "a delivery a millisecond")
}

// While the machine warms up (or a load elsewhere fades), every window
// runs faster than the one before, whatever its limit. Measured one
// after another, each smaller limit would look better than the last; a
// probe compared with the windows on either side of it does not.
func TestBatchPolicyIgnoresADrift(t *testing.T) {
	s := newSim()
	// The same time at every limit, 8 % less every window for 30
	// windows.
	limits := drive(s, 16, 60, func(int) time.Duration {
		return time.Duration(float64(10*time.Millisecond) / (1 + 0.08*float64(min(s.p.windows, 30))))
	})
	require.GreaterOrEqual(t, share(limits, 16), 0.8, "limits %v", limits)
	require.GreaterOrEqual(t, slices.Min(limits[1:]), 1)
	require.Subset(t, []int{1, 8, 16}, limits, "the first probe goes to 1, the others to 16's neighbour")
}

// On a busy machine a window's rate moves by more than the limits
// differ: the policy stays where it is instead of following the noise.
func TestBatchPolicyStaysPutInNoise(t *testing.T) {
	s := newSim()
	noise := rand.New(rand.NewPCG(1, 2))
	factor, window := 1.0, -1
	limits := drive(s, 32, 200, func(int) time.Duration {
		if s.p.windows != window { // ±40 %, a new draw every window
			window, factor = s.p.windows, 0.6+0.8*noise.Float64()
		}
		return time.Duration(factor * float64(10*time.Millisecond))
	})
	require.GreaterOrEqual(t, share(limits, 32), 0.8, "limits %v", limits)
}

// A MaxWait that runs out lowers the capacity by one at most, and sets
// it where it is unknown; more deliveries inside raise it at once.
func TestBatchCapacityFallsSlowly(t *testing.T) {
	var b batcher
	b.inside = 5
	b.waitedOut()
	require.Equal(t, 5, b.capacity, "unknown: what is inside")
	b.capacity, b.inside = 64, 3
	b.waitedOut()
	require.Equal(t, 63, b.capacity, "a wait that ran out while most deliveries were on their way")
	b.inside = 70
	b.waitedOut()
	require.Equal(t, 70, b.capacity)
}

// Every delivery the subscribers hand out being inside starts the
// collecting batch early only while fewer batches run than the capacity
// fills at the limit: otherwise batches of one, once running side by
// side (after a window at limit 1), would each keep the next delivery
// that comes back from waiting for the others, and never merge again.
func TestBatchStartsEarlyOnlyBesideFewerBatchesThanTheCapacityFills(t *testing.T) {
	b := batcher{max: 8, fixed: true, capacity: 16, inside: 16, pending: []*delivery{{}}}
	b.running = 15 // fifteen batches of one, and one delivery back
	require.False(t, b.complete(), "it waits for the others to come back")
	b.running = 2
	require.False(t, b.complete(), "16 in flight at limit 8 fill two batches")
	b.running = 1
	require.True(t, b.complete(), "the other batch runs beside one")
	b.inside = 15
	require.False(t, b.complete(), "a delivery may still join")
	b.running, b.pending = 15, make([]*delivery, 8)
	require.True(t, b.complete(), "a full batch runs whatever else does")

	b = batcher{max: 8, fixed: true, capacity: 12, inside: 12, running: 1, pending: make([]*delivery, 4)}
	require.True(t, b.complete(), "12 in flight at limit 8: the 4 run beside the 8")
}
