package robustness

import (
	"math"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// op builds a history entry for client c over [call, ret].
func op(c int, call, ret int64, in Input, out Output) porcupine.Operation {
	return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: ret}
}

func inProgress(owner string, lease int64, attempts int) View {
	return View{State: "in_progress", Owner: owner, LeaseUntil: lease, Attempts: attempts}
}

func TestModel(t *testing.T) {
	const far = 1 << 40
	acq := func(key, owner string, now, lease int64) Input {
		return Input{Kind: Acquire, Key: key, Owner: owner, Now: now, LeaseUntil: lease, ExpiresAt: far}
	}
	cases := []struct {
		name    string
		history []porcupine.Operation
		want    porcupine.CheckResult
	}{{
		name: "the lifecycle, one client",
		history: []porcupine.Operation{
			op(0, 0, 1, acq("k", "a", 100, 200), Output{OK: true}),
			op(0, 2, 3, Input{Kind: Extend, Key: "k", Owner: "a", LeaseUntil: 300}, Output{OK: true}),
			op(0, 4, 5, Input{Kind: Get, Key: "k", Now: 110}, Output{Found: true, Record: inProgress("a", 300, 1)}),
			op(0, 6, 7, Input{Kind: Complete, Key: "k", Owner: "a", Result: "r"}, Output{OK: true}),
			op(0, 8, 9, acq("k", "b", 120, 220), Output{Record: View{State: "completed", Owner: "a", Attempts: 1, Result: "r"}}),
			op(0, 10, 11, Input{Kind: Release, Key: "k", Owner: "a"}, Output{}),
		},
		want: porcupine.Ok,
	}, {
		name: "two concurrent acquires: one wins, the other sees it",
		history: []porcupine.Operation{
			op(0, 0, 10, acq("k", "a", 100, 200), Output{Record: inProgress("b", 201, 1)}),
			op(1, 0, 10, acq("k", "b", 101, 201), Output{OK: true}),
		},
		want: porcupine.Ok,
	}, {
		name: "two acquires both win without a release: check then set",
		history: []porcupine.Operation{
			op(0, 0, 10, acq("k", "a", 100, 200), Output{OK: true}),
			op(1, 0, 10, acq("k", "b", 101, 201), Output{OK: true}),
		},
		want: porcupine.Illegal,
	}, {
		name: "a reclaim before the lease runs out is refused",
		history: []porcupine.Operation{
			op(0, 0, 1, acq("k", "a", 100, 200), Output{OK: true}),
			op(1, 2, 3, Input{Kind: Reclaim, Key: "k", PrevOwner: "a", Owner: "b", Now: 150, LeaseUntil: 250}, Output{OK: true, Record: inProgress("b", 250, 2)}),
		},
		want: porcupine.Illegal,
	}, {
		name: "an expired lease is reclaimed once, the old owner is fenced",
		history: []porcupine.Operation{
			op(0, 0, 1, acq("k", "a", 100, 200), Output{OK: true}),
			op(1, 2, 5, Input{Kind: Reclaim, Key: "k", PrevOwner: "a", Owner: "b", Now: 200, LeaseUntil: 300}, Output{OK: true, Record: inProgress("b", 300, 2)}),
			op(2, 2, 5, Input{Kind: Reclaim, Key: "k", PrevOwner: "a", Owner: "c", Now: 201, LeaseUntil: 301}, Output{}),
			op(0, 6, 7, Input{Kind: Complete, Key: "k", Owner: "a", Result: "ra"}, Output{}),
			op(1, 6, 7, Input{Kind: Complete, Key: "k", Owner: "b", Result: "rb"}, Output{OK: true}),
		},
		want: porcupine.Ok,
	}, {
		name: "a stale read after a completion is not linearizable",
		history: []porcupine.Operation{
			op(0, 0, 1, acq("k", "a", 100, 200), Output{OK: true}),
			op(0, 2, 3, Input{Kind: Complete, Key: "k", Owner: "a", Result: "r"}, Output{OK: true}),
			op(1, 4, 5, Input{Kind: Get, Key: "k", Now: 110}, Output{Found: true, Record: inProgress("a", 200, 1)}),
		},
		want: porcupine.Illegal,
	}, {
		name: "a lost answer may or may not have taken effect",
		history: []porcupine.Operation{
			op(0, 0, 1, acq("k", "a", 100, 200), Output{OK: true}),
			op(0, 2, math.MaxInt64, Input{Kind: Release, Key: "k", Owner: "a"}, Output{Unknown: true, Err: "timeout"}),
			op(1, 4, 5, Input{Kind: Get, Key: "k", Now: 110}, Output{Found: true, Record: inProgress("a", 200, 1)}),
			op(1, 6, 7, Input{Kind: Get, Key: "k", Now: 120}, Output{}),
		},
		want: porcupine.Ok,
	}, {
		name: "a transactional claim completes at once; a claim or acquire after it sees it",
		history: []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Claim, Key: "k", Now: 100, ExpiresAt: far, Result: "t"}, Output{OK: true}),
			op(1, 2, 3, Input{Kind: Claim, Key: "k", Now: 101, ExpiresAt: far, Result: "u"}, Output{Record: View{State: "completed", Attempts: 1, Result: "t"}}),
			op(1, 4, 5, acq("k", "b", 102, 202), Output{Record: View{State: "completed", Attempts: 1, Result: "t"}}),
		},
		want: porcupine.Ok,
	}, {
		name: "a claim over a live two-phase claim is refused",
		history: []porcupine.Operation{
			op(0, 0, 1, acq("k", "a", 100, 200), Output{OK: true}),
			op(1, 2, 3, Input{Kind: Claim, Key: "k", Now: 101, ExpiresAt: far, Result: "t"}, Output{OK: true}),
		},
		want: porcupine.Illegal,
	}, {
		name: "keys are independent",
		history: []porcupine.Operation{
			op(0, 0, 10, acq("k1", "a", 100, 200), Output{OK: true}),
			op(1, 0, 10, acq("k2", "b", 101, 201), Output{OK: true}),
		},
		want: porcupine.Ok,
	}, {
		name: "a record past its retention is absent to a new claim",
		history: []porcupine.Operation{
			op(0, 0, 1, Input{Kind: Acquire, Key: "k", Owner: "a", Now: 100, LeaseUntil: 200, ExpiresAt: 300}, Output{OK: true}),
			op(1, 2, 3, Input{Kind: Get, Key: "k", Now: 400}, Output{}),
			op(1, 4, 5, acq("k", "b", 400, 500), Output{OK: true}),
		},
		want: porcupine.Ok,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, _ := porcupine.CheckOperationsVerbose(Model, c.history, 0)
			require.Equal(t, c.want, got)
		})
	}
}
