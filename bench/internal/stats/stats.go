// Package stats summarizes the latencies the benchmark programs print.
package stats

import (
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p ≤ 100) of d, nearest
// rank, or 0 if d is empty. d is left as it is.
func Percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}
