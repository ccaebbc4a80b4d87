// Command chaos runs the fault suite (package chaos): several
// worker processes on RabbitMQ with the inbox on a private PostgreSQL
// cluster, killed, restarted and cut off mid-stream, and a ledger that
// counts doubled and lost effects.
//
//	go run ./chaos/cmd/chaos -config full   # make chaos
//	go run ./chaos/cmd/chaos -config ci     # make chaos-ci (.ci/run)
//	go run ./chaos/cmd/chaos -config failover   # primary + replica on ports 5440/5441, killed and promoted
//	go run ./chaos/cmd/chaos -config pair-start -replication sync   # the pair, left running
//	go run ./chaos/cmd/chaos -config pair-stop
//	go run ./chaos/cmd/chaos -config surfaces   # once, httpidem and the partitioned inbox on port 5450
//	go run ./chaos/cmd/chaos -config storm      # reconnect storms: every backend terminated under once.TwoPhase, port 5455
//	go run ./chaos/cmd/chaos -config robust     # histories of every store under faults checked by a model (short, make chaos-ci)
//	go run ./chaos/cmd/chaos -config robust-full  # the same, a minute per backend × fault
//
// It exits 0 when every phase kept its promise, 1 when the ledger found a
// doubled or lost effect or the suite failed. A missing prerequisite
// (RabbitMQ, postgresql-common, the shared PostgreSQL) is skipped with a
// message naming it, or fails under CI=true.
//
// The same binary is each worker and relay process: started by the suite
// with its spec in the environment, it runs that role instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/watermill-idempotent/chaos"
	"github.com/idemkit/watermill-idempotent/chaos/robustness"
	"github.com/idemkit/watermill-idempotent/idempotency"
)

var started = time.Now()

func main() {
	if chaos.IsChild() {
		os.Exit(chaos.RunChild())
	}
	os.Exit(run())
}

func run() int {
	preset := flag.String("config", "ci", "preset: ci (small, under two minutes), surfaces (once, httpidem and the partitioned inbox under faults, on port 5450), surfaces-full, full (thousands of orders, minutes) failover (a primary and a streaming replica killed and promoted, per replication mode) or storm (calls/s of once.TwoPhase before and after every backend is terminated, per driver and StoreTimeout, on port 5455), robust (histories of every store under faults checked by a model, under three minutes), robust-full (a minute per backend × fault); pair-start -replication MODE leaves the pair running in that mode and prints the primary's DSN (for go run ./bench), pair-stop stops it")
	modes := flag.String("replication", "", "failover: comma-separated replication modes (async, sync, remote_apply; default all; none: the service measurement only)")
	lagProcess := flag.String("lag-process", chaos.LagWALReceiver, "failover: the process stopped to make the replica lag (walreceiver or walsender)")
	lag := flag.Duration("lag", 0, "failover: how long the replica is stopped before the primary is killed (0: 3s)")
	stall := flag.Duration("stall", 0, "failover: how long the replica is stopped to measure the commit stall (0: 3s)")
	service := flag.Bool("service", true, "failover: measure how long an in-process inbox, relay and janitor take to resume on the new primary")
	orders := flag.Int("orders", 0, "transactional-phase orders (0: the preset's)")
	twoPhase := flag.Int("two-phase-orders", -1, "two-phase-phase orders, 0 to skip the phase (-1: the preset's)")
	workers := flag.Int("workers", 0, "worker processes per queue (0: 3)")
	duration := flag.Duration("duration", 0, "how long the producer spreads the transactional orders over (0: the preset's)")
	policy := flag.String("two-phase-policy", "intervene", "two-phase expired-lease policy: intervene (0 doubled) or reclaim (re-runs effects by design: shows the ledger sees doubles; 0 lost)")
	batch := flag.Int("batch", 0, "run the transactional phase with group commit, up to this many deliveries per transaction (0: off)")
	keep := flag.Bool("keep", false, "keep the run's tables and queues for inspection")
	keys := flag.Int("keys", -1, "surfaces: keys per keyed scenario, 0 to skip them (-1: the preset's)")
	partitioned := flag.Int("partitioned-orders", -1, "surfaces: orders of the partitioned-inbox phase, 0 to skip it (-1: the preset's)")
	httpPolicy := flag.String("http-policy", "intervene", "surfaces: httpidem's expired-lease policy (intervene or reclaim)")
	stormPools := flag.Int("pools", 0, "storm: connection pools calling at once (0: 6); -workers is each pool's goroutines (0: 12)")
	stormDrivers := flag.String("drivers", "", "storm: comma-separated drivers (database/sql, pgxpool; default both)")
	robustBackends := flag.String("backends", "", "robust: comma-separated backends (memory, sqlite, postgres, mariadb, redis, redis-aof, broken; default all but broken)")
	robustPause := flag.Duration("pause", 0, "robust: the most a client waits between calls (0: 2ms); with -workers (clients, 0: 6) and -duration it makes histories short enough to read")
	robustDir := flag.String("visualize-dir", "", "robust: where failing histories are written as HTML (default the temporary directory)")
	stormTimeouts := flag.String("store-timeouts", "", "storm: comma-separated StoreTimeouts (default 100ms,1s,5s)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch *preset {
	case "pair-start":
		dsn, err := chaos.StartPair(ctx, chaos.FailoverPreset(), *modes)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
			return 1
		}
		fmt.Println(dsn)
		return 0
	case "pair-stop":
		if err := chaos.StopPair(ctx, chaos.FailoverPreset()); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
			return 1
		}
		return 0
	}
	if *preset == "surfaces" || *preset == "surfaces-full" {
		config := chaos.SurfacesCI()
		if *preset == "surfaces-full" {
			config = chaos.SurfacesFull()
		}
		if *partitioned >= 0 {
			config.Orders = *partitioned
		}
		if *keys >= 0 {
			config.Keys = *keys
		}
		if *duration > 0 {
			config.Duration = *duration
		}
		if *httpPolicy == "reclaim" {
			config.HTTPPolicy = idempotency.Reclaim
		}
		config.Workers, config.Keep = *workers, *keep
		report, err := chaos.RunSurfaces(ctx, config)
		if report == nil {
			return finish(nil, err)
		}
		return finish(report, err)
	}
	if *preset == "robust" || *preset == "robust-full" {
		p := robustness.Short()
		if *preset == "robust-full" {
			p = robustness.Full()
		}
		if *robustBackends != "" {
			p.Backends = strings.Split(*robustBackends, ",")
		}
		if *duration > 0 {
			p.Duration = *duration
		}
		p.VisualizeDir = *robustDir
		p.Workload.Clients, p.Workload.Pause = *workers, *robustPause
		return finishRobust(robustness.Run(ctx, p, os.Stderr))
	}
	if *preset == "storm" {
		config := chaos.StormConfig{Pools: *stormPools, Workers: *workers}
		if *stormDrivers != "" {
			config.Drivers = strings.Split(*stormDrivers, ",")
		}
		if *stormTimeouts != "" {
			for _, s := range strings.Split(*stormTimeouts, ",") {
				d, err := time.ParseDuration(s)
				if err != nil {
					fmt.Fprintf(os.Stderr, "chaos: -store-timeouts: %v\n", err)
					return 2
				}
				config.StoreTimeouts = append(config.StoreTimeouts, d)
			}
		}
		report, err := chaos.RunStorm(ctx, config)
		if report == nil {
			return finish(nil, err)
		}
		return finish(report, err)
	}
	if *preset == "failover" {
		config := chaos.FailoverPreset()
		switch *modes {
		case "":
		case "none":
			config.Modes = []string{}
		default:
			config.Modes = strings.Split(*modes, ",")
		}
		if *orders > 0 {
			config.Orders = *orders
		}
		if *duration > 0 {
			config.Duration = *duration
		}
		config.Workers, config.LagProcess, config.Lag, config.Stall, config.Service = *workers, *lagProcess, *lag, *stall, *service
		report, err := chaos.RunFailover(ctx, config)
		if report == nil {
			return finish(nil, err)
		}
		return finish(report, err)
	}
	var config chaos.Config
	switch *preset {
	case "ci":
		config = chaos.CI()
	case "full":
		config = chaos.Full()
	default:
		fmt.Fprintf(os.Stderr, "chaos: unknown -config %q (ci or full)\n", *preset)
		return 2
	}
	if *orders > 0 {
		config.Orders = *orders
	}
	if *twoPhase >= 0 {
		config.TwoPhaseOrders = *twoPhase
	}
	if *duration > 0 {
		config.Duration = *duration
	}
	switch *policy {
	case "intervene":
		config.TwoPhasePolicy = idempotency.Intervene
	case "reclaim":
		config.TwoPhasePolicy = idempotency.Reclaim
	default:
		fmt.Fprintf(os.Stderr, "chaos: unknown -two-phase-policy %q (intervene or reclaim)\n", *policy)
		return 2
	}
	config.Workers = *workers
	config.Keep = *keep
	config.Batch = *batch

	report, err := chaos.Run(ctx, config)
	if report == nil {
		return finish(nil, err)
	}
	return finish(report, err)
}

// finishRobust prints the anomaly table and turns it into an exit
// status: a skipped backend fails only under CI=true.
func finishRobust(results []robustness.Result) int {
	robustness.PrintTable(os.Stdout, results)
	for _, r := range results {
		if r.Skipped != "" && os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "chaos: FAILED: %s skipped: %s (CI=true requires it)\n", r.Backend, r.Skipped)
			return 1
		}
	}
	if !robustness.OK(results) {
		fmt.Fprintf(os.Stderr, "chaos: FAILED after %s: a history was not linearizable (see the table above)\n", time.Since(started).Round(time.Second))
		return 1
	}
	fmt.Printf("chaos: OK in %s\n", time.Since(started).Round(time.Second))
	return 0
}

// reporter is a run's report: *chaos.Report or *chaos.FailoverReport.
type reporter interface {
	Print(io.Writer)
	OK() bool
}

// finish prints the report, if any, and turns the outcome into an exit
// status.
func finish(report reporter, err error) int {
	if report != nil {
		report.Print(os.Stdout)
	}
	if errors.Is(err, chaos.ErrPrerequisite) {
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "chaos: FAILED: %v (CI=true requires it)\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "chaos: skipping: %v (start it, or set CI=true to make this a failure)\n", err)
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: FAILED after %s: %v\n", time.Since(started).Round(time.Second), err)
		return 1
	}
	if !report.OK() {
		fmt.Fprintf(os.Stderr, "chaos: FAILED: a promise was broken (see the tables above)\n")
		return 1
	}
	fmt.Printf("chaos: OK in %s\n", time.Since(started).Round(time.Second))
	return 0
}
