package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/bench/internal/proc"
)

// procsNamed returns the pids whose command name (comm) is one of names.
func procsNamed(names ...string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/comm")
		if err != nil {
			continue
		}
		comm := strings.TrimSpace(string(b))
		for _, n := range names {
			if comm == n {
				pid, _ := strconv.Atoi(filepath.Base(d))
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// snapshot is the CPU ticks of a set of processes at one moment.
type snapshot struct {
	at    time.Time
	ticks map[int]int64
}

func takeSnapshot(pids ...[]int) snapshot {
	s := snapshot{at: time.Now(), ticks: map[int]int64{}}
	for _, ps := range pids {
		for _, p := range ps {
			if t, err := proc.Ticks(p); err == nil {
				s.ticks[p] = t
			}
		}
	}
	return s
}

// cores returns the cores pids used between before and after: CPU
// seconds over wall seconds. A process absent before (started during the
// run) counts from zero.
func cores(before, after snapshot, pids []int) float64 {
	var ticks int64
	for _, p := range pids {
		if a, ok := after.ticks[p]; ok {
			ticks += a - before.ticks[p]
		}
	}
	return float64(ticks) / proc.ClockTicks / after.at.Sub(before.at).Seconds()
}

// cpuUse is a run's CPU, in cores.
type cpuUse struct {
	pgOurs, pgAll, children, broker float64
}

// cpuProbe samples the processes of a run at its start and end.
type cpuProbe struct {
	postgres, broker, children []int
	start                      snapshot
}

// startProbe samples postgres, the children and the broker's processes
// (nil: RabbitMQ's beam.smp).
func startProbe(children, broker []int) *cpuProbe {
	if broker == nil {
		broker = procsNamed("beam.smp")
	}
	p := &cpuProbe{postgres: procsNamed("postgres"), broker: broker, children: children}
	p.start = takeSnapshot(p.postgres, p.broker, p.children)
	return p
}

// finish samples again; ours are the run's postgres backends.
func (p *cpuProbe) finish(ours []int) cpuUse {
	pg := append(procsNamed("postgres"), ours...)
	end := takeSnapshot(pg, p.broker, p.children)
	return cpuUse{
		pgOurs:   cores(p.start, end, ours),
		pgAll:    cores(p.start, end, uniq(pg)),
		children: cores(p.start, end, p.children),
		broker:   cores(p.start, end, p.broker),
	}
}

func uniq(pids []int) []int {
	seen := map[int]bool{}
	var out []int
	for _, p := range pids {
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// walSample is the server's WAL fsync and commit counters (every
// database's, other users' included).
type walSample struct {
	syncs, commits int64
	at             time.Time
}

func sampleWAL(ctx context.Context, db *sql.DB) walSample {
	s := walSample{at: time.Now()}
	_ = db.QueryRowContext(ctx, `SELECT (SELECT wal_sync FROM pg_stat_wal), (SELECT SUM(xact_commit)::bigint FROM pg_stat_database)`).Scan(&s.syncs, &s.commits)
	return s
}

// walRates returns WAL fsyncs per second and commits per fsync between
// two samples.
func walRates(a, b walSample) (fsyncsPerSec, commitsPerSync float64) {
	syncs := float64(b.syncs - a.syncs)
	if syncs <= 0 {
		return 0, 0
	}
	return syncs / b.at.Sub(a.at).Seconds(), float64(b.commits-a.commits) / syncs
}
