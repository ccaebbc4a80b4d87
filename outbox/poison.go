package outbox

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrPermanent marks a publish error as permanent: publishing this
// message again cannot succeed (it is over the broker's size limit, its
// topic is invalid, …). The relay charges such a failure to the row even
// when its topic accepted nothing else, and moves the row to the
// dead-letter table at MaxAttempts without waiting for
// RelayConfig.MinRefusalSpan, so a row the broker always refuses is
// dead-lettered even in a quiet outbox. Wrap it with Permanent, or
// return an error for which errors.Is(err, ErrPermanent) holds, from a
// publisher or a RelayConfig.IsPermanent.
var ErrPermanent = errors.New("outbox: permanent publish error")

// Permanent returns err marked as permanent: errors.Is finds both err
// and ErrPermanent in it, and its message is err's. Permanent(nil) is
// nil. Wrap a publisher to mark the errors it knows are about the
// message, not the broker:
//
//	if errors.Is(err, sarama.ErrMessageSizeTooLarge) {
//		return outbox.Permanent(err)
//	}
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

type permanentError struct{ err error }

func (e permanentError) Error() string   { return e.err.Error() }
func (e permanentError) Unwrap() []error { return []error{e.err, ErrPermanent} }

// IsPermanent is the default RelayConfig.IsPermanent: it reports
// whether err wraps ErrPermanent. Every other error is unknown: it may be
// the broker's, so it is charged to a row only when the row's topic
// accepted another message after the row was first refused (see
// ForwardBatch).
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// publishMode is what a topic's last batch left for its next one.
type publishMode int8

const (
	// modePlain publishes each run of the topic in one call and stops
	// the topic at the first failure.
	modePlain publishMode = iota
	// modeIsolate publishes in halves down to single rows, so that rows
	// the publisher refuses do not hold back the others.
	modeIsolate
	// modeDown follows a batch in which the topic accepted nothing and
	// a row of it was refused, without evidence against the row, with an
	// error not known to be permanent: the topic is presumed down. The
	// batch first publishes the topic's last row alone and publishes
	// nothing more of the topic if that fails too.
	modeDown
)

// Row states within a batch.
const (
	rowPending = iota
	rowPublished
	rowFailed
)

// refusal is a Publish call that failed.
type refusal struct {
	// call numbers it among the relay's calls (history.calls): it
	// returned after every call with a lower number. 0: none.
	call uint64
	at   time.Time // when it returned, on the monotonic clock
}

// history is what a relay remembers between its batches: the evidence
// its poison-row policy weighs. Each topic is a destination of its own —
// a message accepted on one says nothing about another's broker,
// partition or leader — so the memory is kept per topic, and per row the
// first refused call that held it. It is the relay value's own; what
// outlives it is a row's attempts column, so a row once charged stays
// suspect. A restarted relay, or a replica, lacks the rest: it charges
// later, never sooner, and times MinRefusalSpan from its own first
// refusal of the row.
type history struct {
	calls atomic.Uint64 // numbers every Publish call as it returns
	// forgetAfter is how long a row or topic missing from every batch
	// is remembered (the row was published by another relay, deleted by
	// an operator). Forgetting delays a charge, never hastens one.
	forgetAfter time.Duration

	mu      sync.Mutex
	topics  map[string]*topicHistory // topics whose last batch refused something
	refused map[int64]refusedRow     // rows refused, not yet published or moved
	pruned  time.Time
}

// topicHistory is what a topic's last batch left for its next one.
type topicHistory struct {
	mode publishMode
	// accepted is the number of the last call to the topic that the
	// publisher accepted; 0: none since the topic's first refusal.
	accepted uint64
	seen     time.Time // the last batch that held a row of the topic
}

// refusedRow is a row some refused Publish call held.
type refusedRow struct {
	// uuid tells the row from a later one given the same id (MySQL's
	// TRUNCATE restarts AUTO_INCREMENT): that one inherits nothing.
	uuid  string
	first refusal   // the first refused call that held it
	seen  time.Time // the last batch that held it
}

func newHistory(forgetAfter time.Duration) *history {
	return &history{forgetAfter: forgetAfter, topics: map[string]*topicHistory{}, refused: map[int64]refusedRow{}}
}

// forget drops rows moved to the dead-letter table.
func (h *history) forget(ids []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		delete(h.refused, id)
	}
}

// prune drops what no batch held for forgetAfter, at most once per
// forgetAfter. h.mu is held.
func (h *history) prune(now time.Time) {
	if now.Sub(h.pruned) < h.forgetAfter {
		return
	}
	h.pruned = now
	for id, r := range h.refused {
		if now.Sub(r.seen) >= h.forgetAfter {
			delete(h.refused, id)
		}
	}
	for topic, t := range h.topics {
		if now.Sub(t.seen) >= h.forgetAfter {
			delete(h.topics, topic)
		}
	}
}

// topicBatch is one topic within a batch.
type topicBatch struct {
	name string
	mode publishMode // as its last batch left it
	rows []int       // its decodable rows, in id order
	// accepted counts its messages accepted in this batch; lastAccept is
	// the number of the last such call.
	accepted   int
	lastAccept uint64
	// stopped: publish nothing more of the topic in this batch (a plain
	// run failed, or the topic is presumed down).
	stopped bool
	probed  bool
	tried   bool  // some call of the batch held a row of the topic
	runErr  error // the failure of a plain run
}

// batchPublish publishes the rows of one batch and records each row's
// fate. It is the relay's poison-row policy; it knows no database.
type batchPublish struct {
	publisher message.Publisher
	permanent func(error) bool
	hist      *history
	rows      []claimedRow
	state     []int
	errs      []error   // per failed row, the error of its own Publish
	perm      []bool    // per failed row, whether that error is permanent
	first     []refusal // per row, the first refused call that held it
	topics    []*topicBatch
	byTopic   map[string]*topicBatch
	order     []int // published rows in publish order
	lag       []time.Duration
	accepted  int
}

func newBatchPublish(publisher message.Publisher, permanent func(error) bool, hist *history, rows []claimedRow) *batchPublish {
	p := &batchPublish{
		publisher: publisher, permanent: permanent, hist: hist, rows: rows,
		state: make([]int, len(rows)), errs: make([]error, len(rows)), perm: make([]bool, len(rows)),
		first: make([]refusal, len(rows)), byTopic: map[string]*topicBatch{},
	}
	hist.mu.Lock()
	defer hist.mu.Unlock()
	for i, row := range rows {
		if r, ok := hist.refused[row.id]; ok && r.uuid == row.msg.UUID {
			p.first[i] = r.first
		}
		if row.undecodable != nil {
			continue
		}
		t := p.byTopic[row.topic]
		if t == nil {
			t = &topicBatch{name: row.topic}
			if th := hist.topics[row.topic]; th != nil {
				t.mode = th.mode
			}
			p.byTopic[row.topic] = t
			p.topics = append(p.topics, t)
		}
		t.rows = append(t.rows, i)
	}
	return p
}

// publishOutcome is what a batch's publishing decided.
type publishOutcome struct {
	err    error // the failures to report; nil when every row tried was accepted
	charge []int // rows charged one failed attempt, in id order
}

// run publishes the batch's rows, each topic in the mode its last batch
// left, and records what it learnt in the history. A failed plain run
// stops the whole batch, as before any topic isolated: a failure that
// does not last costs the other topics one batch and keeps id order
// across topics. Once a topic isolates, its failures stop only itself,
// and the other topics overtake it.
func (p *batchPublish) run() publishOutcome {
	for _, run := range p.topicRuns() {
		t := p.byTopic[p.rows[run[0]].topic]
		switch {
		case t.stopped:
		case t.mode == modePlain:
			if err := p.publish(run); err != nil {
				t.stopped = true
				t.runErr = fmt.Errorf("outbox: relay: publish %d messages to %q: %w", len(run), t.name, err)
				return p.outcome()
			}
		default:
			if t.mode == modeDown && !t.probed {
				p.probe(t)
			}
			p.bisect(t, run)
		}
	}
	return p.outcome()
}

// outcome charges the failed rows, picks each topic's next mode and
// records both in the history. A row is charged when its own error is
// permanent, when its topic accepted a message after the row was first
// refused (then the topic works and the failure is the row's), or when
// it was charged before: its attempts column keeps that evidence across
// restarts and replicas. A topic that accepted nothing in the batch and
// holds a refused row it has no evidence against is presumed down.
func (p *batchPublish) outcome() publishOutcome {
	var out publishOutcome
	var errs []error
	now := time.Now()
	h := p.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range p.topics {
		accepted := t.lastAccept
		if th := h.topics[t.name]; th != nil {
			accepted = max(accepted, th.accepted)
		}
		var failed, held []int
		for _, i := range t.rows {
			id := p.rows[i].id
			switch {
			case p.state[i] == rowPublished:
				delete(h.refused, id)
				continue
			case p.state[i] != rowFailed:
			case p.perm[i] || accepted > p.first[i].call || p.rows[i].attempts > 0:
				out.charge = append(out.charge, i)
				failed = append(failed, i)
			default:
				failed = append(failed, i)
				held = append(held, i)
			}
			if p.first[i].call != 0 {
				h.refused[id] = refusedRow{uuid: p.rows[i].msg.UUID, first: p.first[i], seen: now}
			}
		}
		if !t.tried {
			// The batch stopped before the topic: it learnt nothing.
			if th := h.topics[t.name]; th != nil {
				th.seen = now
			}
			continue
		}
		next := modeIsolate
		switch {
		case t.runErr != nil:
			errs = append(errs, t.runErr)
		case len(failed) == 0:
			next = modePlain
		case t.accepted == 0 && len(held) > 0:
			next = modeDown
			errs = append(errs, fmt.Errorf("outbox: relay: topic %q accepted none of the messages tried (%d refused; presumed down): %w", t.name, len(failed), p.errs[held[0]]))
		default:
			errs = append(errs, fmt.Errorf("outbox: relay: publisher refused %d of %d messages to %q, each alone; first: %w", len(failed), len(t.rows), t.name, p.errs[failed[0]]))
		}
		if next == modePlain {
			// Every row of the topic in the batch went: nothing of it is
			// left to weigh, and a later refusal comes after any call
			// accepted now.
			delete(h.topics, t.name)
		} else {
			h.topics[t.name] = &topicHistory{mode: next, accepted: accepted, seen: now}
		}
	}
	h.prune(now)
	slices.Sort(out.charge)
	if len(errs) == 1 {
		out.err = errs[0]
	} else {
		out.err = errors.Join(errs...)
	}
	return out
}

// publish sends the rows idx, all of one topic, in one Publish call.
func (p *batchPublish) publish(idx []int) error {
	msgs := make([]*message.Message, len(idx))
	for k, i := range idx {
		msgs[k] = p.rows[i].msg
	}
	t := p.byTopic[p.rows[idx[0]].topic]
	err := p.publisher.Publish(t.name, msgs...)
	call, now := p.hist.calls.Add(1), time.Now()
	t.tried = true
	if err != nil {
		for _, i := range idx {
			if p.first[i].call == 0 {
				p.first[i] = refusal{call: call, at: now}
			}
		}
		return err
	}
	for _, i := range idx {
		p.state[i] = rowPublished
		p.order = append(p.order, i)
		p.lag = append(p.lag, now.Sub(p.rows[i].created))
	}
	t.accepted += len(idx)
	t.lastAccept = call
	p.accepted += len(idx)
	return nil
}

// fail records that row i's own Publish failed with err.
func (p *batchPublish) fail(i int, err error) {
	p.state[i], p.errs[i], p.perm[i] = rowFailed, err, p.permanent(err)
}

// topicRuns splits the decodable rows into runs of consecutive rows of
// one topic.
func (p *batchPublish) topicRuns() [][]int {
	var runs [][]int
	for i, row := range p.rows {
		if row.undecodable != nil {
			continue
		}
		if n := len(runs); n > 0 && p.rows[runs[n-1][0]].topic == row.topic {
			runs[n-1] = append(runs[n-1], i)
			continue
		}
		runs = append(runs, []int{i})
	}
	return runs
}

// bisect publishes the pending rows of idx, a run of topic t, splitting
// it in halves down to single rows when a Publish fails, so one row the
// publisher refuses does not hold back the others. While nothing of t
// has been accepted in the batch, a single row refused with an unknown
// error is followed by a probe of t's last pending row: if that fails
// with an unknown error too, t is presumed down and the batch publishes
// nothing more of it, after about log2(BatchSize)+2 calls. A permanent
// refusal proves nothing about the topic, so it is not followed by a
// probe.
func (p *batchPublish) bisect(t *topicBatch, idx []int) {
	if t.stopped {
		return
	}
	pending := make([]int, 0, len(idx))
	for _, i := range idx {
		if p.state[i] == rowPending {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		return
	}
	err := p.publish(pending)
	switch {
	case err == nil:
	case len(pending) == 1:
		p.fail(pending[0], err)
		if t.accepted == 0 && !p.perm[pending[0]] {
			p.probe(t)
		}
	default:
		mid := len(pending) / 2
		p.bisect(t, pending[:mid])
		p.bisect(t, pending[mid:])
	}
}

// probe publishes t's last pending row alone: whether the topic accepts
// anything at all. An unknown error stops the topic for the batch.
func (p *batchPublish) probe(t *topicBatch) {
	t.probed = true
	for _, j := range slices.Backward(t.rows) {
		if p.state[j] != rowPending {
			continue
		}
		if err := p.publish([]int{j}); err != nil {
			p.fail(j, err)
			t.stopped = !p.perm[j]
		}
		return
	}
}

// deadLetter is a row charged a failed attempt or moved to the
// dead-letter table.
type deadLetter struct {
	row      claimedRow
	attempts int
	err      error
}

// verdicts splits the batch's rows to write: undecodable rows and
// charged rows reaching maxAttempts go to the dead-letter table (dead) —
// for an error not known to be permanent only once the row has been
// refused for minSpan since its first refusal — and the other charged
// rows have their attempt counted (charged). A row at maxAttempts that
// waits for minSpan is neither: it is not charged again, so a batch of
// nothing else writes nothing and Run backs off meanwhile.
func (p *batchPublish) verdicts(charge []int, maxAttempts int, minSpan time.Duration) (dead, charged []deadLetter) {
	for _, row := range p.rows {
		if row.undecodable != nil {
			dead = append(dead, deadLetter{row: row, attempts: row.attempts, err: row.undecodable})
		}
	}
	now := time.Now()
	for _, i := range charge {
		d := deadLetter{row: p.rows[i], attempts: p.rows[i].attempts + 1, err: p.errs[i]}
		switch {
		case d.attempts < maxAttempts:
			charged = append(charged, d)
		case p.perm[i] || now.Sub(p.first[i].at) >= minSpan:
			dead = append(dead, d)
		}
	}
	return dead, charged
}

// publishedIDs returns the ids of the published rows, in publish order.
func (p *batchPublish) publishedIDs() []int64 {
	ids := make([]int64, len(p.order))
	for k, i := range p.order {
		ids[k] = p.rows[i].id
	}
	return ids
}
