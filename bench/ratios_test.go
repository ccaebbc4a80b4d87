package main

import (
	"errors"
	"testing"
	"time"
)

// rowAt is a row whose run completed rate deliveries a second.
func rowAt(rate float64) row {
	return row{r: result{n: int(rate), elapsed: time.Second}}
}

func TestPairedRatioIsTheMedianOfEachRepetitionsRatio(t *testing.T) {
	// G and B at c = 1 in three repetitions of one run (G runs B's code
	// there): the ratio of the medians, 836 over 1,036, is 0.81; the
	// repetitions' ratios are 0.81, 1.16 and 1.00.
	num := []row{rowAt(836), rowAt(1392), rowAt(752)}
	den := []row{rowAt(1036), rowAt(1204), rowAt(749)}
	if got, want := pairedRatio(num, den), 752.0/749; got != want {
		t.Fatalf("pairedRatio = %v, want %v (the middle of 0.81, 1.16 and 1.00)", got, want)
	}
}

func TestPairedRatioSkipsFailedRepetitions(t *testing.T) {
	failed := row{err: errors.New("boom")}
	num := []row{rowAt(900), failed, rowAt(1500), rowAt(1000)}
	den := []row{rowAt(1000), rowAt(1000), rowAt(1000), failed}
	// Two pairs are left, 0.9 and 1.5: their mean.
	if got := pairedRatio(num, den); got < 1.2-1e-9 || got > 1.2+1e-9 {
		t.Fatalf("pairedRatio = %v, want 1.2", got)
	}
	if got := pairedRatio([]row{failed}, []row{rowAt(1)}); got != 0 {
		t.Fatalf("pairedRatio with no pair = %v, want 0", got)
	}
	if got := pairedRatio(nil, den); got != 0 {
		t.Fatalf("pairedRatio of a scenario that did not run = %v, want 0", got)
	}
}
