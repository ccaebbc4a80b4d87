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

// pgbench scripts: F itself, and the statements of A and B replayed by
// pgbench (no Go, no router), to tell the SQL's cost from ours.
const (
	pgbenchInsert = iota // F: one autocommit INSERT
	pgbenchBare          // A's SQL: BEGIN; INSERT; COMMIT
	pgbenchInbox         // B's SQL: BEGIN; claim INSERT … ON CONFLICT DO NOTHING; INSERT; COMMIT
)

// scenarioPgbench is F: pgbench running one INSERT per transaction (an
// autocommit statement: one round trip, one commit) into a table shaped
// like the business table, with c clients, n transactions in all, as the
// database's own limit on this machine. Latencies come from pgbench's
// per-transaction log (-l). With pgbenchBare or pgbenchInbox it replays
// A's or B's statements instead.
func scenarioPgbench(ctx context.Context, pgbench, dsn string, d *database, n, c, kind int) (result, error) {
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
			"INSERT INTO \"" + inboxTable + "\" (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at) " +
			"VALUES ('bench', 'k' || :id, 'completed', sha256(('k' || :id)::bytea), 1, now(), now(), now() + interval '7 days') ON CONFLICT (consumer, dedup_key) DO NOTHING;\n" +
			"INSERT INTO \"" + b.table + "\" (id, amount) VALUES ('k' || :id, 1);\nEND;\n"
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
	perClient := max(n/c, 1)
	cmd := exec.CommandContext(ctx, pgbench,
		"-n",             // no vacuum of pgbench's own tables (there are none)
		"-M", "prepared", // like pgx, which prepares and caches statements
		"-c", strconv.Itoa(c), "-j", strconv.Itoa(min(c, 2)),
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
	total := perClient * c
	return result{n: total, elapsed: time.Duration(float64(total) / tps * float64(time.Second)), latencies: lat}, b.expect(ctx, total)
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
