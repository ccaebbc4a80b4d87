package outbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// ErrPermanent marks a publish error as permanent: publishing this
// message again cannot succeed (it is over the broker's size limit, its
// topic is invalid, …). The relay charges such a failure to the row even
// when the publisher accepted nothing else, so a row the broker always
// refuses reaches MaxAttempts and is dead-lettered even in a quiet
// outbox. Wrap it with Permanent, or return an error for which
// errors.Is(err, ErrPermanent) holds, from a publisher or a
// RelayConfig.IsPermanent.
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
// the broker's, so it is charged to a row only when the publisher
// accepted another message of the same batch.
func IsPermanent(err error) bool { return errors.Is(err, ErrPermanent) }

// publishMode is what a batch leaves for the next one to do.
type publishMode int32

const (
	// modePlain publishes each topic run in one call and stops at the
	// first failure.
	modePlain publishMode = iota
	// modeIsolate publishes in halves down to single rows, so that rows
	// the publisher refuses do not hold back the others.
	modeIsolate
	// modeDown follows a batch in which nothing was accepted and a row
	// was refused with an error not known to be permanent: the publisher
	// is presumed down. The batch first publishes its last row alone and
	// stops there if that fails too.
	modeDown
)

// Row states within a batch.
const (
	rowPending = iota
	rowPublished
	rowFailed
)

// batchPublish publishes the rows of one batch and records each row's
// fate. It is the relay's poison-row policy; it knows no database.
type batchPublish struct {
	publisher message.Publisher
	permanent func(error) bool
	rows      []claimedRow
	state     []int
	errs      []error // per failed row, the error of its own Publish
	order     []int   // published rows in publish order
	lag       []time.Duration
	accepted  int
	stopped   bool // a probe failed with an unknown error: the publisher is presumed down
}

func newBatchPublish(publisher message.Publisher, permanent func(error) bool, rows []claimedRow) *batchPublish {
	return &batchPublish{
		publisher: publisher, permanent: permanent, rows: rows,
		state: make([]int, len(rows)), errs: make([]error, len(rows)),
	}
}

// publishOutcome is what a batch's publishing decided.
type publishOutcome struct {
	next   publishMode
	err    error // the failure to report; nil when every row tried was accepted
	charge []int // rows charged one failed attempt, in id order
}

// run publishes the batch's rows in mode.
func (p *batchPublish) run(mode publishMode) publishOutcome {
	if mode == modePlain {
		if err := p.inOrder(); err != nil {
			return publishOutcome{next: modeIsolate, err: err}
		}
		return publishOutcome{next: modePlain}
	}
	if mode == modeDown {
		p.probe()
	}
	if !p.stopped {
		p.isolate()
	}
	return p.outcome()
}

// outcome charges the failed rows and picks the next mode: a row is
// charged when its own error is permanent, or when the publisher accepted
// another message of the batch (then the failure is the row's, not the
// broker's). With nothing accepted and an unknown error, the publisher
// is presumed down: such rows are not charged.
func (p *batchPublish) outcome() publishOutcome {
	var out publishOutcome
	unknown := 0
	failed := p.failed()
	for _, i := range failed {
		switch {
		case p.permanent(p.errs[i]):
			out.charge = append(out.charge, i)
		case p.accepted > 0:
			out.charge = append(out.charge, i)
			unknown++
		default:
			unknown++
		}
	}
	switch {
	case len(failed) == 0:
		out.next = modePlain
	case p.accepted == 0 && unknown > 0:
		out.next = modeDown
		out.err = fmt.Errorf("outbox: relay: publisher accepted none of the messages tried (%d refused; presumed down): %w", len(failed), p.errs[failed[0]])
	default:
		out.next = modeIsolate
		out.err = fmt.Errorf("outbox: relay: publisher refused %d of %d messages, each alone; first: %w", len(failed), len(p.rows), p.errs[failed[0]])
	}
	return out
}

// publish sends the rows idx, all of one topic, in one Publish call.
func (p *batchPublish) publish(idx []int) error {
	msgs := make([]*message.Message, len(idx))
	for k, i := range idx {
		msgs[k] = p.rows[i].msg
	}
	if err := p.publisher.Publish(p.rows[idx[0]].topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	for _, i := range idx {
		p.state[i] = rowPublished
		p.order = append(p.order, i)
		p.lag = append(p.lag, now.Sub(p.rows[i].created))
	}
	p.accepted += len(idx)
	return nil
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

// inOrder publishes run after run and stops at the first failure,
// returning it; the failed run and everything after it stay pending.
func (p *batchPublish) inOrder() error {
	for _, run := range p.topicRuns() {
		if err := p.publish(run); err != nil {
			return fmt.Errorf("outbox: relay: publish %d messages to %q: %w", len(run), p.rows[run[0]].topic, err)
		}
	}
	return nil
}

// isolate publishes every run, splitting a run whose Publish fails in
// halves down to single rows, so one row the publisher refuses does not
// hold back the others. While nothing of the batch has been accepted, a
// single row refused with an unknown error is followed by a probe of
// the batch's last pending row: if that fails with an unknown error too,
// the publisher is presumed down and the batch stops, after about
// log2(BatchSize)+2 calls. A permanent refusal proves nothing about the
// publisher, so it is not followed by a probe.
func (p *batchPublish) isolate() {
	for _, run := range p.topicRuns() {
		p.bisect(run)
	}
}

func (p *batchPublish) bisect(idx []int) {
	if p.stopped {
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
		p.state[pending[0]], p.errs[pending[0]] = rowFailed, err
		if p.accepted == 0 && !p.permanent(err) {
			p.probe()
		}
	default:
		mid := len(pending) / 2
		p.bisect(pending[:mid])
		p.bisect(pending[mid:])
	}
}

// probe publishes the last pending decodable row alone: whether the
// publisher accepts anything at all. An unknown error stops the batch.
func (p *batchPublish) probe() {
	for j := len(p.rows) - 1; j >= 0; j-- {
		if p.state[j] != rowPending || p.rows[j].undecodable != nil {
			continue
		}
		if err := p.publish([]int{j}); err != nil {
			p.state[j], p.errs[j] = rowFailed, err
			p.stopped = !p.permanent(err)
		}
		return
	}
}

// failed returns the rows whose own Publish failed, in id order.
func (p *batchPublish) failed() []int {
	var out []int
	for i, s := range p.state {
		if s == rowFailed {
			out = append(out, i)
		}
	}
	return out
}

// deadLetter is a row charged a failed attempt or moved to the
// dead-letter table.
type deadLetter struct {
	row      claimedRow
	attempts int
	err      error
}

// verdicts splits the batch's rows to write: undecodable rows and rows
// reaching maxAttempts with the charge go to the dead-letter table
// (dead), the other charged rows have their attempt counted (charged).
func (p *batchPublish) verdicts(charge []int, maxAttempts int) (dead, charged []deadLetter) {
	for _, row := range p.rows {
		if row.undecodable != nil {
			dead = append(dead, deadLetter{row: row, attempts: row.attempts, err: row.undecodable})
		}
	}
	for _, i := range charge {
		d := deadLetter{row: p.rows[i], attempts: p.rows[i].attempts + 1, err: p.errs[i]}
		if d.attempts >= maxAttempts {
			dead = append(dead, d)
		} else {
			charged = append(charged, d)
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
