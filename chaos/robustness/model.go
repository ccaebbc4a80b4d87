package robustness

import (
	"fmt"
	"sort"

	"github.com/anishathalye/porcupine"
)

// Kind names a store operation of the two-phase contract
// (repository.TwoPhase and repository.Reader).
type Kind string

// The operations the model knows.
const (
	Acquire  Kind = "acquire"
	Reclaim  Kind = "reclaim"
	Extend   Kind = "extend"
	Complete Kind = "complete"
	Release  Kind = "release"
	Get      Kind = "get"
	// Claim is the transactional contract in one transaction: Claim,
	// SaveResult when claimed, commit — a key absent or past its
	// retention becomes completed with Result at once.
	Claim Kind = "claim"
)

// Input is one call to a store, as recorded. Times are Unix milliseconds
// and come from the call's own parameters (Now, LeaseUntil, ExpiresAt):
// the stores decide expiry by the time they are given, never by their
// own clock, so the model decides it by the same numbers and expiry needs
// no guess about when the call took effect.
type Input struct {
	Kind Kind
	Key  string
	// Owner is the attempt the call acts for (Acquire, Reclaim's new
	// owner, Extend, Complete, Release).
	Owner string
	// PrevOwner is Reclaim's expected holder of the expired lease.
	PrevOwner string
	// Now is the call's time (Acquire, Reclaim, Get).
	Now int64
	// LeaseUntil is the new lease deadline (Acquire, Reclaim, Extend).
	LeaseUntil int64
	// ExpiresAt is the record's retention deadline (Acquire).
	ExpiresAt int64
	// Result is the stored result (Complete, Claim).
	Result string
}

// View is the part of a stored record the model checks. Comparable, so
// states compare with ==.
type View struct {
	State      string // "in_progress" or "completed"
	Owner      string
	LeaseUntil int64 // 0 for a completed record: completion ends the lease
	Attempts   int
	Result     string
}

// Output is what the store answered.
type Output struct {
	// Unknown marks a call that failed with an error other than the
	// contract's (a timeout, a lost connection): it may or may not have
	// taken effect. Such a call is recorded with an infinite return time,
	// as porcupine's documentation recommends, and the model accepts any
	// answer for it.
	Unknown bool
	// OK is Acquire's Acquired, Claim's Claimed, or success of Reclaim, Extend, Complete
	// and Release (false: ErrLeaseLost).
	OK bool
	// Found is false when Get answered ErrNotFound.
	Found bool
	// Record is Acquire's or Claim's Existing (when not acquired or
	// claimed), Reclaim's record, or Get's record.
	Record View
	// Err is the error text of an unknown outcome, for the visualization.
	Err string
}

// State is the model's state of one key.
type State struct {
	Exists    bool
	Record    View
	ExpiresAt int64
}

func (s State) live(now int64) bool { return s.Exists && s.ExpiresAt > now }

// owned reports whether owner holds the in_progress lease.
func (s State) owned(owner string) bool {
	return s.Exists && s.Record.State == "in_progress" && s.Record.Owner == owner
}

// apply is the sequential contract: the state after in and the answer a
// correct store gives.
func apply(s State, in Input) (State, Output) {
	switch in.Kind {
	case Acquire:
		if s.live(in.Now) {
			return s, Output{Record: s.Record}
		}
		return State{Exists: true, ExpiresAt: in.ExpiresAt, Record: View{
			State: "in_progress", Owner: in.Owner, LeaseUntil: in.LeaseUntil, Attempts: 1,
		}}, Output{OK: true}
	case Claim:
		if s.live(in.Now) {
			return s, Output{Record: s.Record}
		}
		return State{Exists: true, ExpiresAt: in.ExpiresAt, Record: View{
			State: "completed", Attempts: 1, Result: in.Result,
		}}, Output{OK: true}
	case Reclaim:
		if !s.owned(in.PrevOwner) || s.Record.LeaseUntil > in.Now || s.ExpiresAt <= in.Now {
			return s, Output{}
		}
		s.Record.Owner, s.Record.LeaseUntil = in.Owner, in.LeaseUntil
		s.Record.Attempts++
		return s, Output{OK: true, Record: s.Record}
	case Extend:
		if !s.owned(in.Owner) {
			return s, Output{}
		}
		s.Record.LeaseUntil = in.LeaseUntil
		return s, Output{OK: true}
	case Complete:
		if !s.owned(in.Owner) {
			return s, Output{}
		}
		s.Record.State, s.Record.LeaseUntil, s.Record.Result = "completed", 0, in.Result
		return s, Output{OK: true}
	case Release:
		if !s.owned(in.Owner) {
			return s, Output{}
		}
		return State{}, Output{OK: true}
	case Get:
		if !s.Exists {
			return s, Output{}
		}
		return s, Output{Found: true, Record: s.Record}
	}
	panic(fmt.Sprintf("robustness: unknown operation %q", in.Kind))
}

// step is porcupine's Step: whether out is an answer the contract allows
// from s, and the state after it.
func step(state, input, output any) (bool, any) {
	s, in, out := state.(State), input.(Input), output.(Output)
	next, want := apply(s, in)
	if out.Unknown {
		return true, next
	}
	if in.Kind == Get && s.Exists && s.ExpiresAt <= in.Now {
		// A record past its retention may already be deleted, or not
		// yet: either answer is correct.
		if !out.Found {
			return true, s
		}
	}
	out.Err = ""
	return out == want, next
}

// Model is the sequential specification of the two-phase store contract
// for one key, partitioned by key: a key's record is absent, in progress
// (owner, lease deadline, attempts) or completed (result), and every
// operation's answer follows from the state and the call alone.
var Model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		return partition(history)
	},
	Init:              func() any { return State{} },
	Step:              step,
	DescribeOperation: describeOperation,
	DescribeState:     describeState,
}

// partition splits history by key, keys in sorted order.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(Input).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, byKey[k])
	}
	return parts
}

func describeOperation(input, output any) string {
	in, out := input.(Input), output.(Output)
	var call string
	switch in.Kind {
	case Acquire:
		call = fmt.Sprintf("acquire(%s, %s, lease %d)", in.Key, in.Owner, in.LeaseUntil%100000)
	case Reclaim:
		call = fmt.Sprintf("reclaim(%s, %s→%s, now %d)", in.Key, in.PrevOwner, in.Owner, in.Now%100000)
	case Extend:
		call = fmt.Sprintf("extend(%s, %s, lease %d)", in.Key, in.Owner, in.LeaseUntil%100000)
	case Complete, Release:
		call = fmt.Sprintf("%s(%s, %s)", in.Kind, in.Key, in.Owner)
	case Claim:
		call = fmt.Sprintf("claim tx(%s, result %q)", in.Key, in.Result)
	case Get:
		call = fmt.Sprintf("get(%s)", in.Key)
	}
	switch {
	case out.Unknown:
		return call + " → ? (" + out.Err + ")"
	case in.Kind == Get && !out.Found:
		return call + " → not found"
	case in.Kind == Get:
		return call + " → " + describeView(out.Record)
	case (in.Kind == Acquire || in.Kind == Claim) && !out.OK:
		return call + " → taken: " + describeView(out.Record)
	case in.Kind == Reclaim && out.OK:
		return call + " → ok: " + describeView(out.Record)
	case out.OK:
		return call + " → ok"
	}
	return call + " → lease lost"
}

func describeView(v View) string {
	if v.State == "completed" {
		return fmt.Sprintf("completed(%s, attempts %d, result %q)", v.Owner, v.Attempts, v.Result)
	}
	return fmt.Sprintf("in_progress(%s, lease %d, attempts %d)", v.Owner, v.LeaseUntil%100000, v.Attempts)
}

func describeState(state any) string {
	s := state.(State)
	if !s.Exists {
		return "absent"
	}
	return describeView(s.Record)
}
