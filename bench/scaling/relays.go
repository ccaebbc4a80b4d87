package main

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/bench/internal/proc"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// runRelays is one relay row: n relay processes draining o.n rows.
func runRelays(ctx context.Context, db *sql.DB, o options, n int) (runResult, error) {
	sfx := randomSuffix()
	table, app := "scale_outbox_"+sfx, "scaling-"+sfx
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: table})
	if err != nil {
		return runResult{}, err
	}
	if err := ob.Migrate(ctx, db); err != nil {
		return runResult{}, err
	}
	defer func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + table + `_dead_letter`) }()
	for start := 0; start < o.n; start += 1000 {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return runResult{}, err
		}
		var msgs []outbox.Outgoing
		for i := start; i < min(start+1000, o.n); i++ {
			msgs = append(msgs, outbox.Outgoing{Topic: "orders", Message: message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(i)))})
		}
		if err := errors.Join(ob.WriteTx(ctx, tx, msgs...), tx.Commit()); err != nil {
			_ = tx.Rollback()
			return runResult{}, err
		}
	}

	args := []string{"-child", "relay", "-outbox", table, "-app", app}
	if o.batch > 0 {
		args = append(args, "-batch", strconv.Itoa(o.batch))
	}
	cs, err := startChildren(n, args...)
	defer cs.kill()
	if err != nil {
		return runResult{}, err
	}
	probe := startProbe(cs.pids(), nil)
	start := time.Now()
	if err := cs.signal("go"); err != nil {
		return runResult{}, err
	}
	if err := waitFor(ctx, 3*time.Minute, func() (bool, error) {
		left, err := countRows(ctx, db, table)
		return left == 0, err
	}); err != nil {
		return runResult{}, fmt.Errorf("waiting for the outbox to drain: %w", err)
	}
	elapsed := time.Since(start)
	cpu, load, reports, err := cs.finish(ctx, db, app, probe)
	if err != nil {
		return runResult{}, err
	}
	var all [][2]int64
	for _, r := range reports {
		all = append(all, r.Published...)
	}
	if len(all) < o.n {
		return runResult{}, fmt.Errorf("%d published, want at least %d", len(all), o.n)
	}
	// Order every publish by time; count those that came after a larger
	// sequence number.
	slices.SortStableFunc(all, func(a, b [2]int64) int { return cmp.Compare(a[1], b[1]) })
	inversions, maxSeq := 0, int64(-1)
	for _, p := range all {
		if p[0] < maxSeq {
			inversions++
		}
		maxSeq = max(maxSeq, p[0])
	}
	return runResult{rate: float64(o.n) / elapsed.Seconds(), inversions: inversions, cpu: cpu, load: load}, nil
}

// recordingPublisher records what it is asked to publish.
type recordingPublisher struct {
	mu  sync.Mutex
	out [][2]int64
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now().UnixNano()
	for _, m := range msgs {
		seq, err := strconv.ParseInt(string(m.Payload), 10, 64)
		if err != nil {
			return err
		}
		p.out = append(p.out, [2]int64{seq, now})
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

// runRelayChild is a relay process: it prints "ready", runs the relay on
// "go", and stops when stdin closes, printing what it published.
func runRelayChild(c childArgs) error {
	db, err := sql.Open("pgx", proc.AppDSN(c.pgDSN, c.app))
	if err != nil {
		return err
	}
	defer db.Close()
	if err := warm(db, 2); err != nil {
		return err
	}
	pub := &recordingPublisher{}
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, Table: c.outbox, BatchSize: c.batch})
	if err != nil {
		return err
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return fmt.Errorf("expected go: %q %v", line, err)
	}
	done := make(chan error, 1)
	go func() { done <- relay.Run(context.Background()) }()
	_, _ = in.ReadString('\n')
	err = errors.Join(relay.Close(), <-done)
	pub.mu.Lock()
	defer pub.mu.Unlock()
	return errors.Join(err, json.NewEncoder(os.Stdout).Encode(report{Published: pub.out}))
}
