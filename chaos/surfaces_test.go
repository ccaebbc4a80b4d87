package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/once"
)

// keyedLedger is a clean keyed ledger: every key applied once, every
// caller answered with the effect's token.
func keyedLedger(keys int) (map[string][]string, []answer) {
	effects := map[string][]string{}
	var answers []answer
	for i := range keys {
		k := keyName(i)
		effects[k] = []string{"t" + k}
		answers = append(answers, answer{Key: k, Caller: "a", Outcome: outcomeOK, Value: "t" + k},
			answer{Key: k, Caller: "b", Outcome: outcomeReplayed, Value: "t" + k})
	}
	return effects, answers
}

func TestTallyKeyedVerdict(t *testing.T) {
	const keys = 5
	tally := func(mode, policy string, effects map[string][]string, answers []answer, inProgress map[string]bool) Phase {
		ph := Phase{Surface: surfaceOnceTP, Mode: mode, Policy: policy, Orders: keys}
		tallyKeyed(keys, effects, answers, inProgress, &ph)
		return ph
	}
	for _, m := range []struct{ mode, policy string }{{Transactional, ""}, {TwoPhase, "reclaim"}, {TwoPhase, "intervene"}} {
		effects, answers := keyedLedger(keys)
		clean := tally(m.mode, m.policy, effects, answers, nil)
		require.True(t, clean.OK(), "%+v", m)
		require.Equal(t, 2*keys, clean.Messages)

		// A success answered with no effect behind it: wrong, whatever the mode.
		effects, answers = keyedLedger(keys)
		delete(effects, keyName(1))
		ph := tally(m.mode, m.policy, effects, answers, nil)
		require.Equal(t, 2, ph.Wrong)
		require.False(t, ph.OK(), "%+v: success without effect", m)

		// A key nobody got an answer for and no operator holds: lost.
		effects, answers = keyedLedger(keys)
		answers = answers[2:]
		ph = tally(m.mode, m.policy, effects, answers, nil)
		require.Equal(t, 1, ph.UnexplainedLost)
		require.False(t, ph.OK(), "%+v: key never answered", m)

		// A key applied twice.
		effects, answers = keyedLedger(keys)
		effects[keyName(2)] = append(effects[keyName(2)], "again")
		ph = tally(m.mode, m.policy, effects, answers, nil)
		require.Equal(t, 1, ph.Effects.Doubled)
		require.Equal(t, m.policy == "reclaim", ph.OK(), "%+v: doubles are Reclaim's price only", m)

		// A permanent answer other than intervention.
		effects, answers = keyedLedger(keys)
		answers = append(answers, answer{Key: keyName(3), Outcome: outcomeFailed, Value: "422"})
		require.False(t, tally(m.mode, m.policy, effects, answers, nil).OK(), "%+v: failed answer", m)
	}

	// Intervene: a key left in progress is explained, with or without its
	// effect; without the record it is lost.
	effects, answers := keyedLedger(keys)
	delete(effects, keyName(0))
	answers = append([]answer{{Key: keyName(0), Caller: "a", Outcome: outcomeIntervention},
		{Key: keyName(0), Caller: "b", Outcome: outcomeIntervention}}, answers[2:]...)
	ph := tally(TwoPhase, "intervene", effects, answers, map[string]bool{keyName(0): true, keyName(4): true})
	require.True(t, ph.OK(), "%+v", ph)
	require.Equal(t, 2, ph.Intervention)
	require.Equal(t, 1, ph.InterventionApplied)
	ph = tally(TwoPhase, "intervene", effects, answers, map[string]bool{keyName(4): true})
	require.Equal(t, 1, ph.UnexplainedLost)
	require.False(t, ph.OK(), "unresolved key without intervention record")
	// Under Reclaim the same key is lost: nothing waits for an operator.
	require.False(t, tally(TwoPhase, "reclaim", effects, answers, map[string]bool{keyName(0): true}).OK())

	// Effects for keys never called.
	effects, answers = keyedLedger(keys)
	effects["k-999999"] = []string{"x"}
	require.False(t, tally(Transactional, "", effects, answers, nil).OK())
}

func TestSurfacePhaseVerdictNeedsNoReceipts(t *testing.T) {
	require.True(t, Phase{Surface: surfaceOnceTx, Mode: Transactional, Effects: Tally{Applied: 3}}.OK())
	require.False(t, Phase{Mode: Transactional, Effects: Tally{Applied: 3}}.OK(), "Run's phases still need their receipts")
	part := Phase{Surface: surfacePartitioned, Mode: Transactional, Effects: Tally{Applied: 3}, Receipts: &Tally{Applied: 2, Lost: 1}}
	require.False(t, part.OK())
	part.Receipts = &Tally{Applied: 3}
	part.Janitor = &JanitorTally{Partitions: 30, Records: 90, Left: 0}
	require.True(t, part.OK())
	part.Janitor.Left = 1
	require.False(t, part.OK(), "a seeded record the janitor left")
	part.Janitor = &JanitorTally{}
	require.False(t, part.OK(), "nothing seeded: the janitor was not exercised")
}

func TestPlanIsTheSameInEveryGenerationAndRaces(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sp := surfaceSpec{Keys: 100, Start: start, Spread: 10 * time.Second, Late: 0.3, LateAfter: time.Second}
	a := sp.plan("otx-caller-1")
	require.Equal(t, a, sp.plan("otx-caller-1"), "a restarted caller must skip what it answered")
	b := sp.plan("otx-caller-2")
	first := map[string]time.Time{}
	late := 0
	for _, c := range a {
		if c.Pass == 0 {
			first[c.Key] = c.Due
		} else {
			late++
			require.Equal(t, c.Due.Sub(first[c.Key]), time.Second)
		}
	}
	require.Len(t, first, 100)
	require.InDelta(t, 30, late, 15)
	for _, c := range b {
		if c.Pass == 0 {
			require.Equal(t, first[c.Key], c.Due, "every caller calls a key at the same moment, to race")
		}
	}
	for i := 1; i < len(a); i++ {
		require.False(t, a[i].Due.Before(a[i-1].Due))
	}
}

func TestSweeperCutoffWalksTheSeededRange(t *testing.T) {
	to := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	s := &sweeper{from: to.Add(-30 * time.Minute), to: to, spread: 10 * time.Second}
	require.Equal(t, s.from, s.cutoff(0))
	require.Equal(t, to.Add(-15*time.Minute), s.cutoff(5*time.Second))
	require.Equal(t, to, s.cutoff(time.Minute))
}

func TestOnceOutcome(t *testing.T) {
	for _, c := range []struct {
		res     once.Result
		err     error
		outcome string
		retry   bool
	}{
		{once.Result{Value: []byte("v")}, nil, outcomeOK, false},
		{once.Result{Value: []byte("v"), Replayed: true}, nil, outcomeReplayed, false},
		{once.Result{}, fmt.Errorf("x: %w", idempotency.ErrNeedsIntervention), outcomeIntervention, false},
		{once.Result{}, fmt.Errorf("x: %w", idempotency.ErrPayloadMismatch), outcomeFailed, false},
		{once.Result{}, &once.BusyError{Key: "k"}, "", true},
		{once.Result{}, errors.New("conn reset"), "", true},
	} {
		outcome, _, retry := onceOutcome(c.res, c.err)
		require.Equal(t, c.outcome, outcome, "%v", c.err)
		require.Equal(t, c.retry, retry, "%v", c.err)
	}
}

// httpAttempt against a real server answering each way the suite's
// clients must tell apart.
func TestHTTPAttemptClassifies(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, `"k-000001"`, r.Header.Get(httpidem.HeaderKey))
		switch status := r.URL.Query().Get("s"); status {
		case "replayed":
			w.Header().Set(httpidem.HeaderReplayed, "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "tok")
		case "intervention":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"type":"`+httpidem.ProblemNeedsIntervention+`"}`)
		case "busy":
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"type":"`+httpidem.ProblemInFlight+`"}`)
		case "503":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "422":
			w.WriteHeader(http.StatusUnprocessableEntity)
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "tok")
		}
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	for _, c := range []struct {
		query, outcome string
		retry          bool
	}{
		{"ok", outcomeOK, false}, {"replayed", outcomeReplayed, false}, {"intervention", outcomeIntervention, false},
		{"busy", "", true}, {"503", "", true}, {"422", outcomeFailed, false},
	} {
		attempt := httpAttempt(srv.Client(), func() string { return host + "/?s=" + c.query + "#" })
		outcome, value, retry := attempt(context.Background(), "k-000001")
		require.Equal(t, c.outcome, outcome, c.query)
		require.Equal(t, c.retry, retry, c.query)
		if outcome == outcomeOK || outcome == outcomeReplayed {
			require.Equal(t, "tok", value)
		}
	}
	// A server that is gone: retried.
	dead := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(dead.URL, "http://")
	dead.Close()
	_, _, retry := httpAttempt(http.DefaultClient, func() string { return addr })(context.Background(), "k-000001")
	require.True(t, retry)
}

func TestSurfacesConfig(t *testing.T) {
	c := SurfacesCI()
	c.setDefaults()
	require.NoError(t, c.Validate())
	require.Equal(t, DefaultSurfacesPort, c.PGPort)
	c.PGPort = sharedPort
	require.ErrorContains(t, c.Validate(), "must not be the shared one")
	c = SurfacesCI()
	c.Keys, c.Orders = 0, 0
	c.setDefaults()
	require.Error(t, c.Validate())
}
