package main

import (
	"fmt"
	"io"
	"time"

	"github.com/idemkit/watermill-idempotent/bench/internal/stats"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// Scenario G is B with group commit (middleware.Config.Batch): the c
// deliveries in flight share transactions of up to batchMax messages
// (default: c/2, so two batches alternate, one running while the other
// fills), waiting at most batchWait for one another. At c = 1 a batch of
// one is the plain inbox.
//
// Why not c: a batch is one chain of round trips, so one batch of every
// delivery in flight keeps one connection, one PostgreSQL backend and at
// most one core busy. On two cores shared with other work, the scheduler
// gives that one chain a share of the CPU while the bare handler's c
// chains get c shares; at c = 16 and load average 13-16, c/2 ran 1.5
// times as fast as c (docs/batching.md).
//
//	G  B with group commit: one transaction, one multi-row claim and one
//	   commit for the deliveries in flight

// batchSize is G's Batch.MaxMessages at concurrency c (and the k of FG).
func batchSize(o options, c int) int { return orBatchMax(o, max(c/2, 1)) }

// poolBatchSize is G's Batch.MaxMessages in the connection-limited
// scenario P: what BatchConfig.MaxMessages' doc advises with fewer
// connections than deliveries in flight, the deliveries in flight divided
// by the connections.
func poolBatchSize(o options, c int) int { return orBatchMax(o, max(c/o.pool, 1)) }

// orBatchMax is -batch-max if set, else maxMessages.
func orBatchMax(o options, maxMessages int) int {
	if o.batchMax > 0 {
		return o.batchMax
	}
	return maxMessages
}

// groupCommit is G's configuration at concurrency c.
func groupCommit(o options, c int) func(*middleware.Config) {
	return withBatch(o, batchSize(o, c), o.batchFixed)
}

// poolGroupCommit is G's configuration in P, as BatchConfig's docs advise
// where batches always win (more deliveries in flight than connections):
// poolBatchSize, Fixed. The adaptive configuration runs beside it
// (gAdaptive).
func poolGroupCommit(o options, c int) func(*middleware.Config) {
	return withBatch(o, poolBatchSize(o, c), true)
}

// withBatch turns group commit on with maxMessages and fixed.
func withBatch(o options, maxMessages int, fixed bool) func(*middleware.Config) {
	return func(config *middleware.Config) {
		config.Batch = middleware.BatchConfig{MaxMessages: maxMessages, MaxWait: o.batchWait, Fixed: fixed}
	}
}

// gAdaptive labels G in P configured as everywhere else (groupCommit:
// MaxMessages c/2, adaptive).
const gAdaptive = "G inbox, group commit, adaptive c/2"

// batchRatios are G's lines in the ratio table, and the
// connection-limited scenario's (P: c deliveries in flight over a pool of
// p < c connections).
var batchRatios = []ratio{
	{"G/B  group commit vs inbox", "≥ 0.95", "G inbox, group commit", "postgres", "B inbox", "postgres", fGroup, fInbox},
	{"G/A  group commit vs bare", "", "G inbox, group commit", "postgres", "A bare handler", "postgres", fGroup, fBare},
	{"G/FG group commit vs pgbench running G's SQL", "≥ 0.8 at c=16", "G inbox, group commit", "postgres", fGroup, "postgres", "", ""},
	{"G/FG group commit vs pgbench running G's SQL (pgx)", "", "G inbox, group commit", "pgx", fGroup, "postgres", "", ""},
	{"G/FGP group commit vs G's SQL pipelined", "", "G inbox, group commit", "postgres", fGroupPipe, "postgres", "", ""},
	{"FGP/FG G's SQL pipelined vs serial (pgbench)", "", fGroupPipe, "postgres", fGroup, "postgres", "", ""},
	{"G/FGX group commit vs Go (pgx) running G's SQL", "", "G inbox, group commit", "pgx", fGroupGo, "pgx", "", ""},
	{"FGX/FG Go (pgx) vs pgbench, both running G's SQL", "", fGroupGo, "pgx", fGroup, "postgres", "", ""},
	{"G/FGR group commit vs a hand-written batcher behind the router (pgx)", "", "G inbox, group commit", "pgx", fGroupRouter, "pgx", "", ""},
	{"FGR/FGX G's SQL router-fed vs free-running (pgx)", "", fGroupRouter, "pgx", fGroupGo, "pgx", "", ""},
	// FGR/FG is G/FG's bound behind the router: group commit with no
	// inbox at all, the same SQL, driver and router as G.
	{"FGR/FG G/FG's bound behind the router: hand-written batcher (pgx) vs pgbench", "", fGroupRouter, "pgx", fGroup, "postgres", "", ""},
	{"G/W  group commit vs watermill-sql (batch 100; W pre-published)", "", "G inbox, group commit", "postgres", "W watermill-sql (batch 100)", "postgres", "", ""},
	{"G/A  group commit vs bare (pgx)", "", "G inbox, group commit", "pgx", "A bare handler", "pgx", fGroup, fBare},
	{"G/B  group commit vs inbox (pgx)", "≥ 0.95", "G inbox, group commit", "pgx", "B inbox", "pgx", fGroup, fInbox},
	{"G/E  sqlite group commit vs sqlite inbox", "", "G inbox, group commit", "sqlite", "E inbox", "sqlite", "", ""},
	{"G/E  mariadb group commit vs mariadb inbox", "", "G inbox, group commit", "mariadb", "E inbox", "mariadb", "", ""},
	{"P: B/A inbox vs bare, pool p < c", "≥ 0.9", poolLabel("B inbox"), "postgres", poolLabel("A bare handler"), "postgres", "", ""},
	{"P: G/A group commit vs bare, pool p < c (MaxMessages c/p, Fixed)", "≥ 1.5", poolLabel("G inbox, group commit"), "postgres", poolLabel("A bare handler"), "postgres", "", ""},
	{"P: G/B group commit vs inbox, pool p < c (MaxMessages c/p, Fixed)", "", poolLabel("G inbox, group commit"), "postgres", poolLabel("B inbox"), "postgres", "", ""},
	{"P: G/A group commit vs bare, pool p < c (adaptive from c/2)", "", poolLabel(gAdaptive), "postgres", poolLabel("A bare handler"), "postgres", "", ""},
}

// poolLabel is the label of scenario label in the connection-limited run.
func poolLabel(label string) string { return label + ", pool p" }

// printBatchLatency checks G's p99 against its target: at most MaxWait
// plus twice A's p99, at each concurrency.
func printBatchLatency(w io.Writer, rows []row, conc []int, maxWait time.Duration) {
	p99 := func(label string, c int) (time.Duration, bool) {
		for _, r := range rows {
			if r.label == label && r.backend == "postgres" && r.c == c && r.err == nil {
				return stats.Percentile(r.r.latencies, 99), true
			}
		}
		return 0, false
	}
	for _, c := range conc {
		g, okG := p99("G inbox, group commit", c)
		a, okA := p99("A bare handler", c)
		if !okG || !okA {
			continue
		}
		limit := maxWait + 2*a
		verdict := "ok"
		if g > limit {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "G p99 at c=%d: %s, target ≤ MaxWait %s + 2 × A p99 %s = %s: %s\n", c, fmtDur(g), maxWait, fmtDur(a), fmtDur(limit), verdict)
	}
}
