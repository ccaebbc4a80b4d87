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

// groupCommit is G's configuration at concurrency c.
func groupCommit(o options, c int) func(*middleware.Config) {
	maxMessages := o.batchMax
	if maxMessages <= 0 {
		maxMessages = max(c/2, 1)
	}
	return func(config *middleware.Config) {
		config.Batch = middleware.BatchConfig{MaxMessages: maxMessages, MaxWait: o.batchWait}
	}
}

// batchRatios are G's lines in the ratio table.
var batchRatios = []ratio{
	{"G/A  group commit vs bare", "≥ 2 at c=16", "G inbox, group commit", "postgres", "A bare handler", "postgres"},
	{"G/F  group commit vs pgbench", "≥ 1.2 at c=16", "G inbox, group commit", "postgres", "F pgbench INSERT", "postgres"},
	{"G/W  group commit vs watermill-sql (batch 100)", "≥ 1 at c=16", "G inbox, group commit", "postgres", "W watermill-sql (batch 100)", "postgres"},
	{"G/B  group commit vs inbox", "", "G inbox, group commit", "postgres", "B inbox", "postgres"},
	{"G/A  group commit vs bare (pgx)", "", "G inbox, group commit", "pgx", "A bare handler", "pgx"},
	{"G/B  group commit vs inbox (pgx)", "", "G inbox, group commit", "pgx", "B inbox", "pgx"},
	{"G/E  sqlite group commit vs sqlite inbox", "", "G inbox, group commit", "sqlite", "E inbox", "sqlite"},
	{"G/E  mariadb group commit vs mariadb inbox", "", "G inbox, group commit", "mariadb", "E inbox", "mariadb"},
}

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
