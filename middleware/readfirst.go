package middleware

import (
	"sync"
	"sync/atomic"
)

// duplicateRates keeps, per scope, the recent share of duplicates among
// the deliveries, which turns ReadFirst on by itself (Config.ReadFirstAbove).
type duplicateRates struct {
	above  float64 // read first at or above this share; > 1 or < 0: never
	scopes sync.Map
}

// rateShift sets the moving average's weight: each delivery moves it by
// 1/32 of the distance to 0 (first delivery) or 1 (duplicate), so it
// follows about the last 32 deliveries.
const rateShift = 5

// rateOne is 1.0 in the fixed-point share.
const rateOne = 1 << 16

// duplicateRate is one scope's moving average, in fixed point.
type duplicateRate struct {
	share atomic.Int64
	above int64 // threshold in fixed point; 0 for a disabled one
}

// of returns scope's rate; nil (never high, observes nothing) when the
// adaptive read is off.
func (r *duplicateRates) of(scope string) *duplicateRate {
	if r.above <= 0 || r.above > 1 {
		return nil
	}
	if v, ok := r.scopes.Load(scope); ok {
		return v.(*duplicateRate)
	}
	v, _ := r.scopes.LoadOrStore(scope, &duplicateRate{above: max(1, int64(r.above*rateOne))})
	return v.(*duplicateRate)
}

// high reports whether the recent share of duplicates calls for reading
// first.
func (d *duplicateRate) high() bool { return d != nil && d.share.Load() >= d.above }

// observe adds one delivery: a duplicate (the key was stored already) or
// not.
func (d *duplicateRate) observe(duplicate bool) {
	if d == nil {
		return
	}
	target := int64(0)
	if duplicate {
		target = rateOne
	}
	for {
		old := d.share.Load()
		if d.share.CompareAndSwap(old, old+(target-old)>>rateShift) {
			return
		}
	}
}
