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

// scripted is a publisher that refuses every Publish call holding a
// message whose UUID starts with one of refuse's keys, with that key's
// error, and records every call.
type scripted struct {
	refuse map[string]error
	down   error // when set, every call fails with it
	calls  [][]string
}

func (s *scripted) Publish(_ string, msgs ...*message.Message) error {
	uuids := make([]string, len(msgs))
	for i, m := range msgs {
		uuids[i] = m.UUID
	}
	s.calls = append(s.calls, uuids)
	if s.down != nil {
		return s.down
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

func publishRows(pub *scripted, mode publishMode, uuids ...string) (*batchPublish, publishOutcome) {
	p := newBatchPublish(pub, IsPermanent, rows(uuids...))
	return p, p.run(mode)
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
	require.Equal(t, publishOutcome{next: modePlain}, out)
	require.Equal(t, []int{0, 1, 2}, p.order)
	require.Len(t, pub.calls, 1, "one run of one topic, one call")

	pub = &scripted{refuse: map[string]error{"poison": errTooBig}}
	p, out = publishRows(pub, modePlain, "a", "poison", "c")
	require.Equal(t, modeIsolate, out.next)
	require.ErrorIs(t, out.err, ErrPermanent)
	require.Empty(t, out.charge, "a failed run names no row")
	require.Zero(t, p.accepted)
}

func TestIsolateChargesTheRowAmongAcceptedOnes(t *testing.T) {
	pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
	p, out := publishRows(pub, modeIsolate, "a", "b", "c", "poison", "e", "f", "g", "h")
	require.Equal(t, modeIsolate, out.next)
	require.Equal(t, []string{"poison"}, uuidsOf(p, out.charge), "an unknown error is the row's when others were accepted")
	require.Equal(t, 7, p.accepted)
	require.ErrorIs(t, out.err, errUnknown)
	require.Len(t, pub.calls, 7, "8 → 4+4 → 2+2 → 1+1: 1 + 2 + 2 + 2")
}

func TestIsolateWithoutFailureReturnsToPlain(t *testing.T) {
	p, out := publishRows(&scripted{}, modeIsolate, "a", "b")
	require.Equal(t, publishOutcome{next: modePlain}, out)
	require.Equal(t, 2, p.accepted)
}

// The finding of issue 23: poison rows alone, the publisher's error
// unknown. The batch presumes an outage and charges nothing; the next
// batch costs one call.
func TestUnknownRefusalsAloneArePresumedOutage(t *testing.T) {
	for _, n := range []int{1, 2, 10} {
		pub := &scripted{refuse: map[string]error{"poison": errUnknown}}
		p, out := publishRows(pub, modeIsolate, names("poison", n)...)
		require.Equal(t, modeDown, out.next, "%d rows", n)
		require.Empty(t, out.charge)
		require.ErrorContains(t, out.err, "presumed down")
		require.ErrorIs(t, out.err, errUnknown)
		require.Zero(t, p.accepted)
		// The whole run, halves down to the first row, then the probe.
		require.LessOrEqual(t, len(pub.calls), 2+bitsFor(n), "%d rows: %v", n, pub.calls)

		pub.calls = nil
		_, out = publishRows(pub, modeDown, names("poison", n)...)
		require.Equal(t, modeDown, out.next)
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
			require.Equal(t, modeIsolate, out.next, "%d rows, mode %d", n, mode)
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
	require.Equal(t, []string{"poison"}, uuidsOf(p, out.charge), "charged: the publisher accepted others")
	require.Equal(t, modeIsolate, out.next)

	// The publisher is back and the poison row gone: plain next.
	pub = &scripted{}
	p, out = publishRows(pub, modeDown, "a", "b", "c")
	require.Equal(t, publishOutcome{next: modePlain}, out)
	require.Equal(t, []int{2, 0, 1}, p.order, "probe first, then the rest in order")
	require.Len(t, pub.calls, 2)
}

// A publisher that refuses everything with an unknown error: the
// isolating batch stops after the first single row and the probe.
func TestOutageStopsIsolationEarly(t *testing.T) {
	pub := &scripted{down: errUnknown}
	_, out := publishRows(pub, modeIsolate, names("m", 500)...)
	require.Equal(t, modeDown, out.next)
	require.Empty(t, out.charge)
	require.Equal(t, 10, len(pub.calls), "500, 250, 125, 62, 31, 15, 7, 3, 1, then the probe")
}

func TestUndecodableRowsAreSkippedAndDeadLettered(t *testing.T) {
	rs := rows("a", "bad", "c")
	rs[1].undecodable = errors.New("metadata is not a JSON object")
	rs[2].attempts = 2
	pub := &scripted{refuse: map[string]error{"c": errTooBig}}
	p := newBatchPublish(pub, IsPermanent, rs)
	out := p.run(modeIsolate)
	for _, c := range pub.calls {
		require.NotContains(t, c, "bad")
	}
	dead, charged := p.verdicts(out.charge, 3)
	require.Empty(t, charged)
	require.Len(t, dead, 2)
	require.Equal(t, "bad", dead[0].row.msg.UUID)
	require.Zero(t, dead[0].attempts)
	require.Equal(t, "c", dead[1].row.msg.UUID)
	require.Equal(t, 3, dead[1].attempts, "the third charge reaches MaxAttempts 3")
	require.ErrorIs(t, dead[1].err, ErrPermanent)
	require.Equal(t, []int64{1}, p.publishedIDs())

	dead, charged = p.verdicts(out.charge, 4)
	require.Len(t, dead, 1)
	require.Len(t, charged, 1)
	require.Equal(t, 3, charged[0].attempts)
}

func TestTopicRunsSplitByTopic(t *testing.T) {
	rs := rows("a", "b", "c", "d")
	rs[2].topic = "u"
	pub := &scripted{}
	p := newBatchPublish(pub, IsPermanent, rs)
	require.Equal(t, [][]int{{0, 1}, {2}, {3}}, p.topicRuns())
	require.Equal(t, publishOutcome{next: modePlain}, p.run(modePlain))
	require.Len(t, pub.calls, 3)
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
