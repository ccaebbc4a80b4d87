package middleware

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// drive feeds p deliveries whose time in the inbox is cost(limit in
// force), and returns the limit of each window from the first on.
func drive(p *batchPolicy, maxMessages, windows int, cost func(k int) time.Duration) []int {
	p.init(maxMessages)
	var limits []int
	for len(limits) < windows {
		k := p.limit()
		before := p.windows
		p.observe(p.window(), cost(k))
		if p.windows != before {
			limits = append(limits, k)
		}
	}
	return limits
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
	var p batchPolicy
	limits := drive(&p, 8, 60, func(k int) time.Duration { return time.Duration(k+3) * time.Millisecond })
	require.Equal(t, []int{8, 1, 1, 2}, limits[:4], "MaxMessages, then 1 (a window to warm up, one to measure), then 1's neighbour")
	steady := limits[4:]
	require.GreaterOrEqual(t, share(steady, 1), float64(batchAdaptProbe)/(batchAdaptProbe+1)-0.01, "limits %v", steady)
	require.Subset(t, []int{1, 2}, steady, "a probe goes to a neighbour of the best only")

	// Every probe loses: each comes twice as late as the one before, up
	// to batchAdaptMaxBackoff doublings.
	steady = append(steady, drive(&p, 8, 400, func(k int) time.Duration { return time.Duration(k+3) * time.Millisecond })...)
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

// A slow handler: a batch runs k of them in series.
func TestBatchPolicyShrinksWhenTheHandlerIsSlow(t *testing.T) {
	var p batchPolicy
	limits := drive(&p, 32, 60, func(k int) time.Duration { return time.Duration(k)*10*time.Millisecond + time.Millisecond })
	require.GreaterOrEqual(t, share(limits[10:], 1), 0.85, "limits %v", limits)
}

// Where the database is the bottleneck, sharing commits lowers every
// delivery's time up to a point: the policy finds the best batch.
func TestBatchPolicyGrowsWhereBatchesWin(t *testing.T) {
	var p batchPolicy
	// Best at 8 (100/8 + 8 = 20.5 against 29 at 4 and 22.25 at 16).
	limits := drive(&p, 32, 80, func(k int) time.Duration {
		return time.Duration(100/float64(k)+float64(k)) * time.Millisecond
	})
	steady := limits[len(limits)-45:]
	require.GreaterOrEqual(t, share(steady, 8), 0.85, "limits %v", limits)
	require.Subset(t, []int{4, 8, 16}, steady)
}

// Within batchAdaptMargin a larger batch is preferred, for the CPU it
// saves.
func TestBatchPolicyPrefersLargerBatchesWhenEven(t *testing.T) {
	var p batchPolicy
	limits := drive(&p, 16, 50, func(k int) time.Duration { return 100*time.Millisecond + time.Duration(k)*time.Microsecond })
	require.GreaterOrEqual(t, share(limits[10:], 16), 0.85, "limits %v", limits)
}

// When the load changes the best, the probes find the new one.
func TestBatchPolicyFollowsAChangeOfLoad(t *testing.T) {
	var p batchPolicy
	bigWins := func(k int) time.Duration { return time.Duration(100/float64(k)+float64(k)) * time.Millisecond }
	limits := drive(&p, 32, 60, bigWins)
	require.Equal(t, 8, limits[len(limits)-1], "limits %v", limits)
	// Now round trips are slow: every level's time grows with k, and
	// the old estimates are stale.
	slow := func(k int) time.Duration { return time.Duration(k+3) * 10 * time.Millisecond }
	limits = drive(&p, 32, 150, slow)
	require.GreaterOrEqual(t, share(limits[len(limits)-40:], 1), 0.8, "limits %v", limits)
	require.Equal(t, 1, slices.Min(limits))
}
