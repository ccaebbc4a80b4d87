// Command scaling measures how the inbox and the outbox relay scale out
// over processes on one PostgreSQL database. See docs/scaling.md.
//
//	go run ./bench/scaling                          # consumers 1,2,4,8 and relays 1,2,4
//	go run ./bench/scaling -n 20000 -consumers 1,2,4,8 -relays 1,2,3,4
//	go run ./bench/scaling -broker kafka -partitions 16 -relays ""
//
// Consumers: -n messages are published to a durable RabbitMQ queue of the
// run's own (competing consumers: every process subscribes to the same
// queue, RabbitMQ hands each message to one of them). Then N consumer
// processes (this binary re-executed with -child consumer) each run a
// Watermill router with -workers handlers on that queue, every handler
// behind middleware.Inbox (transactional mode, PostgreSQL) inserting one
// row into an orders table in the inbox's transaction. Throughput is the
// number of orders over the span between the first and the last order's
// commit (clock_timestamp() in the row); p50/p99 are the handler chain's
// times (inbox claim + INSERT + commit) over all processes. With -broker
// kafka the messages go to a topic of -partitions partitions on an
// in-process kfake broker instead, and every process joins one consumer
// group with one subscription (one delivery per owned partition at a
// time); the rate is then taken over the middle 80 % of the commits,
// leaving out the group's joins and rebalances.
//
// Relays: -n rows are written to an outbox table of the run's own, then R
// relay processes (-child relay) run outbox.Relay on it with a publisher
// that only records the messages; throughput is rows over the time until
// the table is empty. The children report the order they published in:
// "inversions" counts messages published after one with a larger
// sequence number (by publish time across processes), the ordering cost
// of several relays.
//
// CPU: the utime+stime of every postgres process (from /proc/<pid>/stat)
// is sampled at the start and the end of a run, as is that of the child
// processes and of RabbitMQ (beam.smp); the table shows each as cores
// used (CPU seconds over wall seconds) — this machine has runtime.NumCPU
// of them. "pg (ours)" counts only the backends whose application_name is
// the run's; "pg (all)" every postgres process, other users' included:
// the machine is shared, so the load average is printed beside each row.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/idemkit/watermill-idempotent/bench/internal/proc"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
)

type options struct {
	broker     string
	partitions int
	n          int
	consumers  []int
	relays     []int
	workers    int
	prefetch   int
	batch      int
	pgDSN      string
	amqpURL    string
}

func main() {
	var o options
	var child, cons, rels string
	var c childArgs
	flag.IntVar(&o.n, "n", 20000, "messages per run")
	flag.StringVar(&o.broker, "broker", "amqp", "consumers' broker: amqp (one competing-consumer queue) or kafka (in-process kfake, one topic, one consumer group)")
	flag.IntVar(&o.partitions, "partitions", 16, "kafka: the topic's partitions")
	flag.StringVar(&cons, "consumers", "1,2,4,8", "consumer process counts (empty: skip)")
	flag.StringVar(&rels, "relays", "1,2,4", "relay process counts (empty: skip)")
	flag.IntVar(&o.workers, "workers", 4, "handlers (concurrent deliveries) per consumer process")
	flag.IntVar(&o.prefetch, "prefetch", 4, "RabbitMQ prefetch per handler")
	flag.IntVar(&o.batch, "batch", 0, "relay BatchSize (0: the relay's default)")
	flag.StringVar(&child, "child", "", "internal: run as a consumer or relay child process")
	flag.StringVar(&c.queue, "queue", "", "internal: child's queue")
	flag.StringVar(&c.inbox, "inbox", "", "internal: child's inbox table")
	flag.StringVar(&c.orders, "orders", "", "internal: child's orders table")
	flag.StringVar(&c.outbox, "outbox", "", "internal: child's outbox table")
	flag.StringVar(&c.app, "app", "", "internal: child's application_name")
	flag.StringVar(&c.brokers, "brokers", "", "internal: child's Kafka brokers (comma-separated); empty: AMQP")
	flag.Parse()
	o.pgDSN, o.amqpURL = testenv.PostgresDSN(), testenv.AMQPURL()
	if o.broker != "amqp" && o.broker != "kafka" {
		fmt.Fprintln(os.Stderr, "scaling: -broker must be amqp or kafka")
		os.Exit(2)
	}
	c.workers, c.prefetch, c.batch, c.pgDSN, c.amqpURL = o.workers, o.prefetch, o.batch, o.pgDSN, o.amqpURL

	var err error
	switch child {
	case "consumer":
		err = runConsumerChild(c)
	case "relay":
		err = runRelayChild(c)
	case "":
		if o.consumers, err = parseCounts(cons); err == nil {
			if o.relays, err = parseCounts(rels); err == nil {
				err = run(context.Background(), o, os.Stdout)
			}
		}
	default:
		err = fmt.Errorf("unknown -child %q", child)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scaling:", err)
		os.Exit(1)
	}
}

func parseCounts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, o options, w io.Writer) error {
	db, err := sql.Open("pgx", o.pgDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("PostgreSQL (%s=%s) is required: %w", testenv.PostgresEnv, o.pgDSN, err)
	}
	var syncCommit string
	_ = db.QueryRowContext(ctx, `SHOW synchronous_commit`).Scan(&syncCommit)
	fmt.Fprintf(w, "scaling: %d messages per run, %d CPUs, GOMAXPROCS %d per process, synchronous_commit=%s, load average at start %s\n",
		o.n, runtime.NumCPU(), runtime.GOMAXPROCS(0), syncCommit, proc.LoadAverage())

	if len(o.consumers) > 0 {
		if o.broker == "kafka" {
			fmt.Fprintf(w, "\nconsumers: one consumer group on a kfake topic of %d partitions (one delivery per partition at a time), inbox on PostgreSQL; msgs/s over the middle 80%% of commits, \"broker\" is this process (kfake)\n", o.partitions)
		} else {
			fmt.Fprintf(w, "\nconsumers: competing consumers on one RabbitMQ queue, %d handlers per process (prefetch %d each), inbox on PostgreSQL\n", o.workers, o.prefetch)
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "procs\thandlers\tmsgs/s\tp50\tp99\tpg (ours)\tpg (all)\tconsumers\tbroker\tWAL fsync/s\tcommits/fsync\tload avg\t")
		for _, n := range o.consumers {
			r, err := runConsumers(ctx, db, o, n)
			if err != nil {
				return fmt.Errorf("%d consumers: %w", n, err)
			}
			fmt.Fprintf(tw, "%d\t%d\t%.0f\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.1f\t%s\t\n", n, r.handlers, r.rate,
				ms(r.p50), ms(r.p99), r.cpu.pgOurs, r.cpu.pgAll, r.cpu.children, r.cpu.broker, r.fsyncs, r.commitsPerSync, r.load)
			fmt.Fprintf(os.Stderr, "scaling: %d consumer processes done: %.0f msgs/s\n", n, r.rate)
		}
		_ = tw.Flush()
	}
	if len(o.relays) > 0 {
		fmt.Fprintf(w, "\nrelays: outbox.Relay processes on one outbox table (PostgreSQL, LISTEN/NOTIFY on), publisher records only\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "relays\tmsgs/s\tinversions\tpg (ours)\tpg (all)\trelays cpu\tload avg\t")
		for _, n := range o.relays {
			r, err := runRelays(ctx, db, o, n)
			if err != nil {
				return fmt.Errorf("%d relays: %w", n, err)
			}
			fmt.Fprintf(tw, "%d\t%.0f\t%d\t%.2f\t%.2f\t%.2f\t%s\t\n", n, r.rate, r.inversions,
				r.cpu.pgOurs, r.cpu.pgAll, r.cpu.children, r.load)
			fmt.Fprintf(os.Stderr, "scaling: %d relay processes done: %.0f msgs/s\n", n, r.rate)
		}
		_ = tw.Flush()
	}
	fmt.Fprintf(w, "\nload average at the end %s; CPU columns are cores used (CPU seconds / wall seconds)\n", proc.LoadAverage())
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// runResult is one row.
type runResult struct {
	rate       float64
	p50, p99   time.Duration
	inversions int
	handlers   int
	cpu        cpuUse
	// fsyncs is WAL fsyncs per second, commitsPerSync the commits each
	// covered (group commit), server-wide.
	fsyncs, commitsPerSync float64
	load                   string
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// children are the child processes of one run.
type children struct {
	procs []*childProc
}

type childProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr strings.Builder
}

// start starts n children with args and waits until each prints
// "ready".
func startChildren(n int, args ...string) (*children, error) {
	// The callers defer kill before checking err: cs is never nil.
	cs := &children{}
	exe, err := os.Executable()
	if err != nil {
		return cs, err
	}
	for range n {
		p := &childProc{cmd: exec.Command(exe, args...)}
		p.cmd.Stderr = &p.stderr
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			return cs, err
		}
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			return cs, err
		}
		p.stdout = bufio.NewReaderSize(out, 1<<20)
		if err := p.cmd.Start(); err != nil {
			return cs, err
		}
		cs.procs = append(cs.procs, p)
	}
	for _, p := range cs.procs {
		line, err := p.stdout.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			return cs, fmt.Errorf("child did not get ready (%q, %v): %s", line, err, p.stderr.String())
		}
	}
	return cs, nil
}

// pids returns the children's process ids.
func (cs *children) pids() []int {
	var pids []int
	for _, p := range cs.procs {
		pids = append(pids, p.cmd.Process.Pid)
	}
	return pids
}

// signal writes line to every child.
func (cs *children) signal(line string) error {
	var errs []error
	for _, p := range cs.procs {
		_, err := io.WriteString(p.stdin, line+"\n")
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// finish ends a run: it samples the CPU of the probe's processes and of
// the run's postgres backends (application_name app) and the load
// average, then closes the children's stdin (their signal to stop),
// decodes the report each writes, and waits for them.
func (cs *children) finish(ctx context.Context, db *sql.DB, app string, probe *cpuProbe) (cpuUse, string, []report, error) {
	ours, err := proc.Backends(ctx, db, app)
	if err != nil {
		return cpuUse{}, "", nil, err
	}
	cpu := probe.finish(ours)
	load := proc.LoadAverage()
	for _, p := range cs.procs {
		_ = p.stdin.Close()
	}
	reports := make([]report, len(cs.procs))
	var errs []error
	for i, p := range cs.procs {
		if err := json.NewDecoder(p.stdout).Decode(&reports[i]); err != nil {
			errs = append(errs, fmt.Errorf("child report: %w: %s", err, p.stderr.String()))
		}
		if err := p.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("child: %w: %s", err, p.stderr.String()))
		}
	}
	return cpu, load, reports, errors.Join(errs...)
}

// countRows returns the number of rows in table.
func countRows(ctx context.Context, db *sql.DB, table string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table).Scan(&n)
	return n, err
}

// kill ends children that are still running (after a failed run).
func (cs *children) kill() {
	for _, p := range cs.procs {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	}
}

// waitFor polls cond every 20ms until it is true, fails, or timeout.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
