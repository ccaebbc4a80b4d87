package outbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
)

// scripted is a publisher that refuses every Publish call to a topic
// in down with that topic's error, and every call holding a message
// whose UUID starts with one of refuse's keys with that key's error, and
// records every call.
type scripted struct {
	refuse map[string]error
	down   map[string]error // by topic; "" refuses every topic
	calls  [][]string
	topics []string // the topic of each call
}

func (s *scripted) Publish(topic string, msgs ...*message.Message) error {
	uuids := make([]string, len(msgs))
	for i, m := range msgs {
		uuids[i] = m.UUID
	}
	s.calls = append(s.calls, uuids)
	s.topics = append(s.topics, topic)
	if err := s.down[""]; err != nil {
		return err
	}
	if err := s.down[topic]; err != nil {
		return err
	}
	for _, m := range msgs {
		for prefix, err := range s.refuse {
			if strings.HasPrefix(m.UUID, prefix) {
				return err
			}
		}
	}
	return nil
}

func (s *scripted) Close() error { return nil }

// rows returns claimed rows of topic t named by uuids, ids from 1.
func rows(uuids ...string) []claimedRow {
	out := make([]claimedRow, len(uuids))
	for i, u := range uuids {
		out[i] = claimedRow{id: int64(i + 1), topic: "t", msg: message.NewMessage(u, nil), created: time.Now()}
	}
	return out
}

// onTopics returns rows named "topic/uuid", of that topic, ids from 1.
func onTopics(names ...string) []claimedRow {
	out := rows(names...)
	for i := range out {
		out[i].topic, _, _ = strings.Cut(names[i], "/")
	}
	return out
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

var (
	errUnknown = errors.New("broker said no")
	errTooBig  = Permanent(errors.New("message too large"))
)

// withMode returns a fresh history in which topic "t" is in mode.
func withMode(mode publishMode) *history {
	h := newHistory(time.Hour)
	if mode != modePlain {
		h.topics["t"] = &topicHistory{mode: mode, seen: time.Now()}
	}
	return h
}

// modeOf returns the mode topic's last batch left in h.
func modeOf(h *history, topic string) publishMode {
	if t := h.topics[topic]; t != nil {
		return t.mode
	}
	return modePlain
}

func publishRows(pub *scripted, mode publishMode, uuids ...string) (*batchPublish, publishOutcome) {
	p := newBatchPublish(pub, IsPermanent, withMode(mode), rows(uuids...))
	return p, p.run()
}

// batch runs one batch of rs on h.
func batch(pub *scripted, h *history, rs []claimedRow) (*batchPublish, publishOutcome) {
	p := newBatchPublish(pub, IsPermanent, h, rs)
	return p, p.run()
}

func uuidsOf(p *batchPublish, idx []int) []string {
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = p.rows[i].msg.UUID
	}
	return out
}

func TestPlainPublishesRunsAndStopsAtFailure(t *testing.T) {
	pub := &scripted{}
	p, out := publishRows(pub, modePlain, "a", "b", "c")
	require.Equal(t, publishOutcome{}, out)
	require.Equal(t, modePlain, modeOf(p.hist, "t"))
	require.Equal(t, []int{0, 1, 2}, p.order)
	require.Len(t, pub.calls, 1, "one run of one topic, one call")

	pub = &scripted{refuse: map[string]error{"poison": errTooBig}}
	p, out = publishRows(pub, modePlain, "a", "poison", "c")
	require.Equal(t, modeIsolate, modeOf(p.hist, "t"))
	require.ErrorIs(t, out.err, ErrPermanent)
	require.Empty(t, out.charge, "a failed run names no row")
	require.Zero(t, p.accepted)
}

func TestIsolateChargesTheRowAmongAcceptedOnes(t *testing.T) {
	pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
	p, out := publishRows(pub, modeIsolate, "a", "b", "c", "poison", "e", "f", "g", "h")
	require.Equal(t, modeIsolate, modeOf(p.hist, "t"))
	require.Equal(t, []string{"poison"}, uuidsOf(p, out.charge), "an unknown error is the row's when its topic accepted others after its first refusal")
	require.Equal(t, 7, p.accepted)
	require.ErrorIs(t, out.err, errUnknown)
	require.Len(t, pub.calls, 7, "8 → 4+4 → 2+2 → 1+1: 1 + 2 + 2 + 2")
}

func TestIsolateWithoutFailureReturnsToPlain(t *testing.T) {
	p, out := publishRows(&scripted{}, modeIsolate, "a", "b")
	require.Equal(t, publishOutcome{}, out)
	require.Equal(t, modePlain, modeOf(p.hist, "t"))
	require.Equal(t, 2, p.accepted)
	require.Empty(t, p.hist.topics, "a topic back to plain is forgotten")
}

// The finding of issue 23: poison rows alone, the publisher's error
// unknown. The batch presumes the topic down and charges nothing; the
// next batch costs one call.
func TestUnknownRefusalsAloneArePresumedOutage(t *testing.T) {
	for _, n := range []int{1, 2, 10} {
		pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
		h := withMode(modeIsolate)
		p, out := batch(pub, h, rows(names("poison", n)...))
		require.Equal(t, modeDown, modeOf(h, "t"), "%d rows", n)
		require.Empty(t, out.charge)
		require.ErrorContains(t, out.err, "presumed down")
		require.ErrorIs(t, out.err, errUnknown)
		require.Zero(t, p.accepted)
		// The whole run, halves down to the first row, then the probe.
		require.LessOrEqual(t, len(pub.calls), 2+bitsFor(n), "%d rows: %v", n, pub.calls)

		pub.calls = nil
		_, out = batch(pub, h, rows(names("poison", n)...))
		require.Equal(t, modeDown, modeOf(h, "t"))
		require.Empty(t, out.charge)
		require.Equal(t, [][]string{{fmt.Sprintf("poison%02d", n-1)}}, pub.calls, "down: the last row alone, nothing more")
	}
}

func bitsFor(n int) int {
	b := 0
	for 1<<b < n {
		b++
	}
	return b
}

// Permanent refusals alone: every row fails alone and is charged, in
// isolate and in down mode, so each reaches MaxAttempts in as many
// batches.
func TestPermanentRefusalsAloneAreCharged(t *testing.T) {
	for _, n := range []int{1, 2, 10} {
		for _, mode := range []publishMode{modeIsolate, modeDown} {
			pub := &scripted{refuse: map[string]error{"poison": errTooBig}}
			p, out := publishRows(pub, mode, names("poison", n)...)
			require.Equal(t, modeIsolate, modeOf(p.hist, "t"), "%d rows, mode %d", n, mode)
			require.Len(t, out.charge, n, "%d rows, mode %d", n, mode)
			require.ErrorIs(t, out.err, ErrPermanent)
			singles := map[string]int{}
			for _, c := range pub.calls {
				if len(c) == 1 {
					singles[c[0]]++
				}
			}
			for _, u := range uuidsOf(p, out.charge) {
				require.Equal(t, 1, singles[u], "%s refused alone once", u)
			}
		}
	}
}

func TestDownProbesTheLastRowThenIsolates(t *testing.T) {
	pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
	p, out := publishRows(pub, modeDown, "poison", "a", "b", "c")
	require.Equal(t, []string{"c"}, pub.calls[0], "the probe")
	require.Equal(t, 3, p.accepted)
	require.Equal(t, []string{"poison"}, uuidsOf(p, out.charge), "charged: its topic accepted others after its first refusal")
	require.Equal(t, modeIsolate, modeOf(p.hist, "t"))

	// The publisher is back and the poison row gone: plain next.
	pub = &scripted{}
	p, out = publishRows(pub, modeDown, "a", "b", "c")
	require.Equal(t, publishOutcome{}, out)
	require.Equal(t, modePlain, modeOf(p.hist, "t"))
	require.Equal(t, []int{2, 0, 1}, p.order, "probe first, then the rest in order")
	require.Len(t, pub.calls, 2)
}

// A publisher that refuses everything with an unknown error: the
// isolating batch stops after the first single row and the probe.
func TestOutageStopsIsolationEarly(t *testing.T) {
	pub := &scripted{down: map[string]error{"": errUnknown}}
	p, out := publishRows(pub, modeIsolate, names("m", 500)...)
	require.Equal(t, modeDown, modeOf(p.hist, "t"))
	require.Empty(t, out.charge)
	require.Equal(t, 10, len(pub.calls), "500, 250, 125, 62, 31, 15, 7, 3, 1, then the probe")
}

// Issue 36, finding 1: topic u refuses everything with an error the
// relay cannot classify while topic t flows. The messages accepted on t
// say nothing about u: u's rows are never charged, however many batches
// pass, and t is not held back; a permanent refusal on u is still
// charged.
func TestTopicsAreJudgedApart(t *testing.T) {
	h := newHistory(time.Hour)
	pub := &scripted{down: map[string]error{"u": errUnknown}}
	rs := onTopics("u/inv0", "t/ord0", "u/inv1", "t/ord1", "u/inv2", "t/ord2")
	p, out := batch(pub, h, rs)
	require.Empty(t, p.order, "a failed plain run stops the whole batch: id order across topics")
	require.Equal(t, [][]string{{"u/inv0"}}, pub.calls)
	require.Equal(t, modeIsolate, modeOf(h, "u"))
	require.Equal(t, modePlain, modeOf(h, "t"), "t was not tried")
	for b := range 20 {
		p, out = batch(pub, h, rs)
		require.Empty(t, out.charge, "batch %d", b)
		require.ErrorIs(t, out.err, errUnknown)
		require.Equal(t, []string{"t/ord0", "t/ord1", "t/ord2"}, uuidsOf(p, p.order), "batch %d: t flows", b)
		require.Equal(t, modePlain, modeOf(h, "t"))
		require.Equal(t, modeDown, modeOf(h, "u"), "batch %d", b)
	}
	require.ErrorContains(t, func() error { _, out := batch(pub, h, rs); return out.err }(), `topic "u" accepted none`)

	pub.down["u"] = errTooBig
	_, out = batch(pub, h, rs)
	require.NotEmpty(t, out.charge, "a permanent refusal is charged whatever the topic did")

	// u is back: everything goes, and u returns to plain.
	pub.down = nil
	p, out = batch(pub, h, rs)
	require.Equal(t, publishOutcome{}, out)
	require.Equal(t, 6, p.accepted)
	require.Equal(t, modePlain, modeOf(h, "u"))
	require.Empty(t, h.refused)
}

// Evidence outlives the batch: a poison row refused while its topic
// accepted others is charged again when it is left alone (the topic's
// other rows went out), batch after batch, without IsPermanent. A row
// first refused after its topic's last acceptance has no evidence
// against it.
func TestEvidenceAgainstARowOutlivesItsBatch(t *testing.T) {
	h := newHistory(time.Hour)
	pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
	rs := rows("a", "poison", "b", "c")
	_, out := batch(pub, h, rs)
	require.Empty(t, out.charge, "plain: the run failed as a whole")
	p, out := batch(pub, h, rs)
	require.Equal(t, []string{"poison"}, uuidsOf(p, out.charge))

	for b := range 5 {
		p, out = batch(pub, h, rs[1:2]) // the poison row alone, the same id
		require.Equal(t, []string{"poison"}, uuidsOf(p, out.charge), "alone, batch %d", b)
		require.ErrorIs(t, out.err, errUnknown)
		require.NotContains(t, out.err.Error(), "presumed down")
	}

	// Another row refused alone, first after the topic's last
	// acceptance: not charged, the topic presumed down.
	lone := claimedRow{id: 99, topic: "t", msg: message.NewMessage("poison-late", nil), created: time.Now()}
	_, out = batch(pub, h, []claimedRow{lone})
	require.Empty(t, out.charge)
	require.ErrorContains(t, out.err, "presumed down")
	require.Equal(t, modeDown, modeOf(h, "t"))
}

// A row alone from the start, refused with an unknown error: no
// evidence against it until another row of its topic is accepted, then
// charged in that batch and the next ones.
func TestLoneRowWaitsForItsTopicToAcceptAnother(t *testing.T) {
	h := newHistory(time.Hour)
	pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
	poison := rows("poison")
	for range 3 {
		_, out := batch(pub, h, poison)
		require.Empty(t, out.charge)
	}
	require.Equal(t, modeDown, modeOf(h, "t"))
	withGood := append(rows("poison"), claimedRow{id: 2, topic: "t", msg: message.NewMessage("good", nil), created: time.Now()})
	p, out := batch(pub, h, withGood)
	require.Equal(t, []string{"good"}, uuidsOf(p, p.order), "the probe")
	require.Equal(t, []string{"poison"}, uuidsOf(p, out.charge))
	_, out = batch(pub, h, poison)
	require.Len(t, out.charge, 1, "charged alone now")
}

// A row charged before — by another relay, or by this one before a
// restart — stays suspect: its attempts column is the evidence that
// outlives a relay's memory.
func TestAChargedRowStaysSuspectAcrossRelays(t *testing.T) {
	pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
	rs := rows("poison")
	_, out := batch(pub, withMode(modeIsolate), rs)
	require.Empty(t, out.charge, "never charged: no evidence")
	rs[0].attempts = 1
	h := newHistory(time.Hour) // a fresh relay
	_, out = batch(pub, h, rs)
	require.Empty(t, out.charge, "a plain run names no row")
	_, out = batch(pub, h, rs)
	require.Equal(t, []int{0}, out.charge, "charged before: a fresh relay charges it")
}

// A charged row at MaxAttempts is moved at once for a permanent error,
// and for an unknown one only when its refusals span minSpan; until then
// it is neither moved nor charged again.
func TestVerdictsWaitForMinRefusalSpan(t *testing.T) {
	pub := &scripted{refuse: map[string]error{"poison": errUnknown, "huge": errTooBig}}
	rs := rows("a", "poison", "huge", "b")
	for i := range rs {
		rs[i].attempts = 2
	}
	h := newHistory(time.Hour)
	batch(pub, h, rs) // plain: fails as a whole
	p, out := batch(pub, h, rs)
	require.Equal(t, []string{"poison", "huge"}, uuidsOf(p, out.charge))

	dead, charged := p.verdicts(out.charge, 4, time.Hour)
	require.Len(t, charged, 2, "below MaxAttempts")
	require.Empty(t, dead)

	dead, charged = p.verdicts(out.charge, 3, time.Hour)
	require.Empty(t, charged, "the unknown refusal waits for its span, uncharged")
	require.Len(t, dead, 1)
	require.Equal(t, "huge", dead[0].row.msg.UUID, "a permanent refusal does not wait")

	p.first[1].at = time.Now().Add(-time.Hour - time.Second) // first refused over an hour ago
	dead, charged = p.verdicts(out.charge, 3, time.Hour)
	require.Empty(t, charged)
	require.Equal(t, []string{"poison", "huge"}, []string{dead[0].row.msg.UUID, dead[1].row.msg.UUID})
	require.Equal(t, 3, dead[0].attempts)
}

// The history forgets rows and topics no batch held for forgetAfter, and
// the rows moved to the dead-letter table.
func TestHistoryForgets(t *testing.T) {
	h := newHistory(time.Minute)
	pub := &scripted{down: map[string]error{"": errUnknown}}
	batch(pub, h, rows("a", "b"))
	require.Len(t, h.refused, 2)
	require.Len(t, h.topics, 1)
	h.forget([]int64{1})
	require.Len(t, h.refused, 1)

	h.mu.Lock()
	h.prune(time.Now().Add(30 * time.Second))
	require.Len(t, h.refused, 1, "seen within forgetAfter")
	h.prune(time.Now().Add(2 * time.Minute))
	require.Empty(t, h.refused)
	require.Empty(t, h.topics)
	h.mu.Unlock()
}

func TestUndecodableRowsAreSkippedAndDeadLettered(t *testing.T) {
	rs := rows("a", "bad", "c")
	rs[1].undecodable = errors.New("metadata is not a JSON object")
	rs[2].attempts = 2
	pub := &scripted{refuse: map[string]error{"c": errTooBig}}
	p, out := batch(pub, withMode(modeIsolate), rs)
	for _, c := range pub.calls {
		require.NotContains(t, c, "bad")
	}
	dead, charged := p.verdicts(out.charge, 3, time.Hour)
	require.Empty(t, charged)
	require.Len(t, dead, 2)
	require.Equal(t, "bad", dead[0].row.msg.UUID)
	require.Zero(t, dead[0].attempts)
	require.Equal(t, "c", dead[1].row.msg.UUID)
	require.Equal(t, 3, dead[1].attempts, "the third charge reaches MaxAttempts 3")
	require.ErrorIs(t, dead[1].err, ErrPermanent)
	require.Equal(t, []int64{1}, p.publishedIDs())

	dead, charged = p.verdicts(out.charge, 4, time.Hour)
	require.Len(t, dead, 1)
	require.Len(t, charged, 1)
	require.Equal(t, 3, charged[0].attempts)
}

func TestTopicRunsSplitByTopic(t *testing.T) {
	rs := rows("a", "b", "c", "d")
	rs[2].topic = "u"
	pub := &scripted{}
	p := newBatchPublish(pub, IsPermanent, newHistory(time.Hour), rs)
	require.Equal(t, [][]int{{0, 1}, {2}, {3}}, p.topicRuns())
	require.Equal(t, publishOutcome{}, p.run())
	require.Len(t, pub.calls, 3)
	require.Equal(t, []string{"t", "u", "t"}, pub.topics, "in id order across topics")
}

func TestPermanent(t *testing.T) {
	base := errors.New("too large")
	err := Permanent(base)
	require.ErrorIs(t, err, ErrPermanent)
	require.ErrorIs(t, err, base)
	require.Equal(t, "too large", err.Error())
	require.True(t, IsPermanent(fmt.Errorf("cannot produce message: %w", err)))
	require.False(t, IsPermanent(base))
	require.False(t, IsPermanent(nil))
	require.NoError(t, Permanent(nil))
}

func TestRetryPauseDoublesUpToTheCap(t *testing.T) {
	r := &Relay{config: RelayConfig{RetryInterval: time.Second}}
	r.config.setDefaults()
	var got []time.Duration
	for n := 1; n <= 8; n++ {
		got = append(got, r.retryPause(n))
	}
	s := time.Second
	require.Equal(t, []time.Duration{s, 2 * s, 4 * s, 8 * s, 16 * s, 30 * s, 30 * s, 30 * s}, got)
	require.Equal(t, 30*time.Second, r.retryPause(1<<20), "no overflow")

	r = &Relay{config: RelayConfig{RetryInterval: time.Minute}}
	r.config.setDefaults()
	require.Equal(t, time.Minute, r.config.MaxRetryInterval, "the cap defaults to at least RetryInterval")
	require.Equal(t, time.Minute, r.retryPause(5))
}

func TestRelayConfigValidatesRetryCap(t *testing.T) {
	c := RelayConfig{Dialect: PostgreSQL, RetryInterval: time.Second, MaxRetryInterval: time.Millisecond}
	c.setDefaults()
	require.ErrorContains(t, c.Validate(), "RelayConfig.MaxRetryInterval must be at least RetryInterval")
}
