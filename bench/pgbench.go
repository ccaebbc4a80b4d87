package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// pgbench scripts: F itself, and the statements of A, B and G replayed by
// pgbench (no Go, no router), to tell the SQL's cost from ours.
const (
	pgbenchInsert = iota // F: one autocommit INSERT
	pgbenchBare          // A's SQL: BEGIN; INSERT; COMMIT
	pgbenchInbox         // B's SQL: BEGIN; claim INSERT … ON CONFLICT DO NOTHING; INSERT; COMMIT
	// G's SQL in G's shape: c/k clients, each transaction BEGIN; one
	// k-row claim … RETURNING; k INSERTs; COMMIT, k = G's batch size.
	pgbenchGroup
	// pgbenchGroup with the transaction's statements in one pipeline
	// (\startpipeline … \endpipeline): one round trip a batch, the floor
	// of any batch that waits for nothing between its statements.
	pgbenchGroupPipelined
)

// claimColumns are the inbox claim's columns (internal/sqlstore's Claim).
const claimColumns = "(consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)"

// claimRow is the claim row of key (an SQL expression) in B's and G's
// scripts.
func claimRow(key string) string {
	return "('bench', " + key + ", 'completed', sha256((" + key + ")::bytea), 1, now(), now(), now() + interval '7 days')"
}

// groupScript is G's transaction of k deliveries for pgbench.
func groupScript(inboxTable, businessTable string, k int, pipelined bool) string {
	var s strings.Builder
	s.WriteString("\\set id random(1, 9000000000000000)\n")
	if pipelined {
		s.WriteString("\\startpipeline\n")
	}
	s.WriteString("BEGIN;\nINSERT INTO \"" + inboxTable + "\" " + claimColumns + " VALUES ")
	for j := range k {
		if j > 0 {
			s.WriteString(", ")
		}
		s.WriteString(claimRow(fmt.Sprintf("'k' || :id || '-%d'", j)))
	}
	s.WriteString(" ON CONFLICT (consumer, dedup_key) DO NOTHING RETURNING consumer, dedup_key;\n")
	for j := range k {
		fmt.Fprintf(&s, "INSERT INTO \"%s\" (id, amount) VALUES ('k' || :id || '-%d', 1);\n", businessTable, j)
	}
	s.WriteString("END;\n")
	if pipelined {
		s.WriteString("\\endpipeline\n")
	}
	return s.String()
}

// scenarioPgbench is F: pgbench running one INSERT per transaction (an
// autocommit statement: one round trip, one commit) into a table shaped
// like the business table, with c clients, n transactions in all, as the
// database's own limit on this machine. Latencies come from pgbench's
// per-transaction log (-l). With pgbenchBare or pgbenchInbox it replays
// A's or B's statements instead; with pgbenchGroup(Pipelined), G's, k
// deliveries a transaction, over max(c/k, 1) clients (G's c deliveries in
// flight make c/k batches at once).
func scenarioPgbench(ctx context.Context, pgbench, dsn string, d *database, n, c, kind, k int) (result, error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_f")
	if err != nil {
		return result{}, err
	}
	body := `INSERT INTO "` + b.table + `" (id, amount) VALUES (gen_random_uuid()::text, 1);` + "\n"
	switch kind {
	case pgbenchBare:
		body = "\\set id random(1, 9000000000000000)\nBEGIN;\nINSERT INTO \"" + b.table + "\" (id, amount) VALUES ('k' || :id, 1);\nEND;\n"
	case pgbenchInbox:
		_, _, inboxTable, err := newInbox(ctx, d, t, nil, 0)
		if err != nil {
			return result{}, err
		}
		body = "\\set id random(1, 9000000000000000)\nBEGIN;\n" +
			"INSERT INTO \"" + inboxTable + "\" " + claimColumns + " VALUES " + claimRow("'k' || :id") + " ON CONFLICT (consumer, dedup_key) DO NOTHING;\n" +
			"INSERT INTO \"" + b.table + "\" (id, amount) VALUES ('k' || :id, 1);\nEND;\n"
	case pgbenchGroup, pgbenchGroupPipelined:
		_, _, inboxTable, err := newInbox(ctx, d, t, nil, 0)
		if err != nil {
			return result{}, err
		}
		body = groupScript(inboxTable, b.table, k, kind == pgbenchGroupPipelined)
	}
	perTx := 1 // deliveries a transaction
	clients := c
	if kind == pgbenchGroup || kind == pgbenchGroupPipelined {
		perTx, clients = k, max(c/k, 1)
	}
	dir, err := os.MkdirTemp("", "watermill-idempotent-pgbench")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "insert.sql")
	if err := os.WriteFile(script, []byte(body), 0o600); err != nil {
		return result{}, err
	}
	perClient := max(n/(clients*perTx), 1)
	cmd := exec.CommandContext(ctx, pgbench,
		"-n",             // no vacuum of pgbench's own tables (there are none)
		"-M", "prepared", // like pgx, which prepares and caches statements
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 2)),
		"-t", strconv.Itoa(perClient),
		"-l", "--log-prefix", filepath.Join(dir, "log"),
		"-f", script, dsn)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return result{}, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		return result{}, fmt.Errorf("pgbench: no tps in output:\n%s", out)
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return result{}, err
	}
	lat, err := readPgbenchLogs(dir)
	if err != nil {
		return result{}, err
	}
	txs := perClient * clients
	total := txs * perTx
	return result{n: total, elapsed: time.Duration(float64(txs) / tps * float64(time.Second)), latencies: lat}, b.expect(ctx, total)
}

// readPgbenchLogs reads the third column (transaction latency, µs) of
// every line of pgbench's per-transaction logs in dir.
func readPgbenchLogs(dir string) ([]time.Duration, error) {
	files, err := filepath.Glob(filepath.Join(dir, "log.*"))
	if err != nil {
		return nil, err
	}
	var lat []time.Duration
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			us, err := strconv.ParseInt(fields[2], 10, 64)
			if err != nil {
				continue
			}
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return lat, nil
}
