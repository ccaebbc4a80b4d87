package chaos

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestFailoverConfigRefusesSharedPorts(t *testing.T) {
	for _, port := range []int{sharedPort, DefaultPort} {
		c := FailoverPreset()
		c.PrimaryPort = port
		c.setDefaults()
		require.ErrorContains(t, c.Validate(), "must not use port")
	}
	c := FailoverPreset()
	c.Modes = []string{"semi-sync"}
	c.setDefaults()
	require.ErrorContains(t, c.Validate(), "unknown replication mode")

	c = FailoverPreset()
	c.setDefaults()
	require.NoError(t, c.Validate())
	require.Equal(t, []string{Async, Sync, RemoteApply}, c.Modes)
	pr := newPair(c.PGVersion, c.PrimaryPort, c.ReplicaPort)
	require.NoError(t, pr.a.safe())
	require.NoError(t, pr.b.safe())
}

// The pair's DSN is what a service on a failover setup uses: pgconn reads
// both hosts and keeps only a server that accepts writes.
func TestPairDSNIsMultiHostReadWrite(t *testing.T) {
	pr := newPair("15", DefaultFailoverPrimaryPort, DefaultFailoverReplicaPort)
	cfg, err := pgconn.ParseConfig(pr.DSN("app"))
	require.NoError(t, err)
	require.Equal(t, uint16(DefaultFailoverPrimaryPort), cfg.Port)
	require.Len(t, cfg.Fallbacks, 1)
	require.Equal(t, uint16(DefaultFailoverReplicaPort), cfg.Fallbacks[0].Port)
	require.NotNil(t, cfg.ValidateConnect, "target_session_attrs=read-write installs a check")
	require.Equal(t, 2*time.Second, cfg.ConnectTimeout)
}

func TestPairSettingsPerMode(t *testing.T) {
	require.NotContains(t, pairSettings(Async), "synchronous_standby_names")
	require.Contains(t, pairSettings(Sync), "synchronous_standby_names = '*'\nsynchronous_commit = on")
	require.Contains(t, pairSettings(RemoteApply), "synchronous_commit = remote_apply")
}

func TestChildrenOf(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pids, err := childrenOf(cmd.Process.Pid)
	require.NoError(t, err)
	require.Empty(t, pids)
	mine, err := childrenOf(os.Getpid())
	require.NoError(t, err)
	require.Contains(t, mine, cmd.Process.Pid)
}

func TestFailoverVerdict(t *testing.T) {
	clean := Tally{Applied: 10}
	ok := FailoverResult{Replication: Sync, Phase: Phase{Mode: Transactional, Effects: clean, Receipts: &clean}}
	require.True(t, ok.OK())

	lost := ok
	lost.Phase.Effects = Tally{Applied: 9, Lost: 1}
	require.False(t, lost.OK(), "synchronous replication loses nothing acknowledged")
	lost.Replication = Async
	require.False(t, lost.OK(), "an asynchronous loss must be on the old primary")
	lost.EffectsOnOldPrimary = 1
	require.True(t, lost.OK())

	probe := ok
	probe.ProbeLost = 1
	require.False(t, probe.OK())

	doubled := ok
	doubled.Replication = Async
	doubled.Phase.Effects = Tally{Applied: 10, Doubled: 1}
	require.False(t, doubled.OK())
}

func TestServiceVerdict(t *testing.T) {
	s := ServiceResult{Inbox: time.Second, RelayNotify: time.Second, RelayPoll: time.Second, Janitor: time.Second,
		Ready: time.Second, Unready: time.Second, NotifyLatency: 5 * time.Millisecond}
	require.True(t, s.OK())
	never := s
	never.RelayNotify = -1
	require.False(t, never.OK())
	polled := s
	polled.NotifyLatency = serviceNotifyPoll
	require.False(t, polled.OK(), "a relay waiting for its poll interval did not get its LISTEN back")
	unnoticed := s
	unnoticed.Unready = -1
	require.False(t, unnoticed.OK(), "readiness must report the outage")
	restart := s
	restart.LiveFailed = true
	require.False(t, restart.OK())
}
