package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClusterRefusesTheSharedOne(t *testing.T) {
	for _, c := range []cluster{
		{version: "15", name: "main", port: DefaultPort},
		{version: "15", name: "chaos", port: sharedPort},
		{version: "15", name: "", port: DefaultPort},
	} {
		require.Error(t, c.safe(), "%s", c)
		require.Error(t, c.ctl(t.Context(), "restart", "-m", "fast"), "%s", c)
	}
	require.NoError(t, cluster{version: "15", name: "chaos", port: DefaultPort}.safe())

	config := CI()
	config.PGPort = sharedPort
	config.setDefaults()
	require.ErrorContains(t, config.Validate(), "must not be the shared one")
	require.Contains(t, cluster{port: DefaultPort}.DSN("x"), "connect_timeout=5")
}

func TestNamesAreValidAndPerRunAndMode(t *testing.T) {
	seen := map[string]bool{}
	for _, run := range []string{"c0123abcd", "cffff0000"} {
		for _, mode := range []string{Transactional, TwoPhase} {
			n := namesFor(run, mode)
			require.NoError(t, n.validate())
			for _, name := range []string{n.Inbox, n.Outbox, n.Effects, n.Receipts, n.Orders, n.Payments, n.Poison} {
				require.False(t, seen[name], "%s used twice", name)
				seen[name] = true
			}
		}
	}
}

func TestPhaseVerdict(t *testing.T) {
	clean := Tally{Applied: 10}
	tx := Phase{Mode: Transactional, Orders: 10, Effects: clean, Receipts: &clean}
	require.True(t, tx.OK())

	doubled := tx
	doubled.Effects = Tally{Applied: 10, Doubled: 1}
	require.False(t, doubled.OK())

	lostReceipt := tx
	lostReceipt.Receipts = &Tally{Applied: 9, Lost: 1}
	require.False(t, lostReceipt.OK())

	dead := tx
	dead.DeadLetters = 1
	require.False(t, dead.OK(), "no payment may end in the relay's dead letters")

	poisoned := tx
	poisoned.Poisoned = 1
	require.False(t, poisoned.OK(), "nothing may be poisoned in transactional mode")

	// Two-phase with Intervene: a missing effect is fine when an operator
	// holds the key, a doubled one never is.
	tp := Phase{Mode: TwoPhase, Policy: "intervene", Orders: 10, Effects: Tally{Applied: 9, Lost: 1}, Intervention: 2, InterventionApplied: 1, Poisoned: 2}
	require.True(t, tp.OK())
	tp.UnexplainedLost = 1
	require.False(t, tp.OK())
	tp.UnexplainedLost = 0
	tp.Effects.Doubled = 1
	require.False(t, tp.OK())

	// Reclaim re-runs by design: doubles are its price, losses are not.
	reclaim := Phase{Mode: TwoPhase, Policy: "reclaim", Orders: 10, Effects: Tally{Applied: 10, Doubled: 3}}
	require.True(t, reclaim.OK())
	reclaim.Effects.Lost = 1
	require.False(t, reclaim.OK())
}

func TestBatchConfigAndLabel(t *testing.T) {
	config := CI()
	config.Batch = -1
	config.setDefaults()
	require.ErrorContains(t, config.Validate(), "Batch")
	require.Equal(t, "transactional (group commit, batch 8)", Phase{Mode: Transactional, Batch: 8}.label())
	require.Equal(t, "transactional", Phase{Mode: Transactional}.label())
}
