package chaos

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/dsn"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// quietPeriod is how long the queues must stay empty before the drain
// stops the workers: longer than a delivery's in-process retries (about
// 2.5 s) take.
const quietPeriod = 4 * time.Second

// names are one phase's tables and topics; every run has its own.
type names struct {
	Inbox, Outbox, Effects, Receipts string // tables
	Orders, Payments, Poison         string // topics (queue: topic + "_workers")
}

func namesFor(run, mode string) names {
	short := "tx"
	if mode == TwoPhase {
		short = "tp"
	}
	t := "chaos_" + run + "_" + short + "_"
	topic := "chaos." + run + "." + short + "."
	return names{
		Inbox: t + "inbox", Outbox: t + "outbox", Effects: t + "effects", Receipts: t + "receipts",
		Orders: topic + "orders", Payments: topic + "payments", Poison: topic + "poison",
	}
}

// validate checks the table names, which reach SQL unquoted.
func (n names) validate() error {
	var errs []error
	for _, t := range []string{n.Inbox, n.Outbox, n.Effects, n.Receipts} {
		errs = append(errs, repository.ValidateTableName(t))
	}
	return errors.Join(errs...)
}

// Run runs the suite: prerequisites, the private cluster, the
// transactional phase, the two-phase phase; it stops the private cluster
// before returning. The error is about the suite itself (a missing
// prerequisite wraps ErrPrerequisite); what the ledger found is in the
// Report (see Report.OK).
func Run(ctx context.Context, config Config) (*Report, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	exe, err := prerequisites(config.AMQPURL)
	if err != nil {
		return nil, err
	}
	cl, admin, done, err := openPrivate(ctx, config)
	if err != nil {
		return nil, err
	}
	defer done()

	run, err := newRun("c", &config.LogDir)
	if err != nil {
		return nil, err
	}
	// The two-phase effects happen in another database than the inbox
	// store: a SQLite file no fault touches.
	ledgerPath := filepath.Join(config.LogDir, "two-phase-ledger.db")
	ledger, err := sqlite.Open(ledgerPath)
	if err != nil {
		return nil, err
	}
	defer ledger.Close()
	report := &Report{Run: run, Started: time.Now().UTC(), Workers: config.Workers, Cluster: cl.String(), LogDir: config.LogDir}
	fmt.Fprintf(config.Out, "chaos: run %s, %d workers, child logs in %s\n", run, config.Workers, config.LogDir)

	e := &env{config: config, exe: exe, run: run, cluster: cl, admin: admin, ledger: ledger, ledgerPath: ledgerPath}
	phases := []struct {
		mode          string
		orders        int
		duration, per time.Duration
	}{
		{Transactional, config.Orders, config.Duration, config.FaultEvery},
		{TwoPhase, config.TwoPhaseOrders, config.TwoPhaseDuration, config.TwoPhaseFaultEvery},
	}
	for _, p := range phases {
		if p.orders == 0 {
			continue
		}
		phase, err := e.phase(ctx, p.mode, p.orders, p.duration, &deck{e: e, mode: p.mode, orders: p.orders, every: p.per, dealt: make(chan struct{})})
		if phase != nil {
			report.Phases = append(report.Phases, *phase)
		}
		if err != nil {
			report.Elapsed = time.Since(report.Started)
			return report, err
		}
	}
	report.Elapsed = time.Since(report.Started)
	return report, nil
}

// openPrivate locks, creates if needed and starts the private cluster of
// config and returns it with an admin connection; done closes the
// connection, stops the cluster and unlocks it.
func openPrivate(ctx context.Context, config Config) (_ cluster, admin *sql.DB, done func(), err error) {
	return openCluster(ctx, cluster{version: config.PGVersion, name: config.PGCluster, port: config.PGPort}, config.Out)
}

// openCluster is openPrivate for the cluster cl.
func openCluster(ctx context.Context, cl cluster, out io.Writer) (_ cluster, admin *sql.DB, done func(), err error) {
	unlock, err := lockCluster(cl, out)
	if err != nil {
		return cl, nil, nil, err
	}
	var undo []func()
	done = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		unlock()
	}
	defer func() {
		if err != nil {
			done()
		}
	}()
	fmt.Fprintf(out, "chaos: private PostgreSQL cluster %s\n", cl)
	if err := cl.ensure(ctx); err != nil {
		return cl, nil, nil, err
	}
	undo = append(undo, func() { stopOnReturn(ctx, out, "the private cluster", cl.stop) })
	if admin, err = openDB(cl.DSN("chaos-admin"), 4); err != nil {
		return cl, nil, nil, err
	}
	undo = append(undo, func() { _ = admin.Close() })
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := waitReady(rctx, admin, "the private cluster "+cl.String()); err != nil {
		return cl, nil, nil, err
	}
	return cl, admin, done, nil
}

// lockCluster serialises runs on one private cluster: a run stops the
// cluster at its end and restarts it mid-stream, which a concurrent run
// must not see.
func lockCluster(cl cluster, out io.Writer) (func(), error) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("watermill-idempotent-chaos-%d.lock", cl.port))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fmt.Fprintf(out, "chaos: another run holds %s; waiting for it\n", path)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("chaos: lock %s: %w", path, err)
		}
	}
	return func() { _ = f.Close() }, nil
}

// stopOnReturn stops private clusters with stop, also after ctx ended,
// and reports a failure to out.
func stopOnReturn(ctx context.Context, out io.Writer, what string, stop func(context.Context) error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := stop(sctx); err != nil {
		fmt.Fprintf(out, "chaos: stopping %s: %v\n", what, err)
	}
}

// prerequisites returns this binary's path (the children run it) once
// RabbitMQ answers.
func prerequisites(amqpURL string) (exe string, err error) {
	exe, err = os.Executable()
	if err != nil {
		return "", fmt.Errorf("chaos: finding this binary to start workers: %w", err)
	}
	return exe, checkAMQP(amqpURL)
}

// newRun names a run (prefix and 8 random hex digits) and makes its log
// directory unless *logDir is set.
func newRun(prefix string, logDir *string) (string, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	run := prefix + hex.EncodeToString(b[:])
	if *logDir == "" {
		dir, err := os.MkdirTemp("", "chaos-"+run+"-")
		if err != nil {
			return "", err
		}
		*logDir = dir
	}
	return run, nil
}

func checkAMQP(url string) error {
	conn, err := amqp091.DialConfig(url, amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)})
	if err != nil {
		return fmt.Errorf("%w: RabbitMQ (%s=%s): %v", ErrPrerequisite, AMQPEnv, dsn.Redact(url), err)
	}
	return conn.Close()
}

// env is what every phase of a run shares.
type env struct {
	config     Config
	exe        string
	run        string
	cluster    cluster
	admin      *sql.DB // private cluster
	ledger     *sql.DB // the two-phase effects ledger (SQLite)
	ledgerPath string
	// dsnFor, when set, addresses the children and replaces cluster.DSN
	// (the failover run's multi-host DSN).
	dsnFor func(app string) string
	// afterTally, when set, runs once the ledger is tallied, before the
	// phase's tables are dropped.
	afterTally func(ctx context.Context, n names) error
	// partitioned runs the transactional phase on the partitioned inbox,
	// its table spelled two ways, with expired partitions for a janitor
	// to drop under the faults (RunSurfaces).
	partitioned bool
}

func (e *env) dsn(app string) string {
	if e.dsnFor != nil {
		return e.dsnFor(app)
	}
	return e.cluster.DSN(app)
}

// progress prints timestamped progress lines with CHAOS_VERBOSE set.
func (e *env) progress() func(string) {
	if os.Getenv("CHAOS_VERBOSE") == "" {
		return func(string) {}
	}
	return func(s string) { e.say("%s %s", time.Now().Format("15:04:05.000"), s) }
}

// schedule injects one phase's faults while its orders flow.
type schedule interface {
	// String describes the faults for the progress line.
	String() string
	// run injects faults until ctx ends. Returning nil before that means
	// the schedule is complete; an error fails the phase.
	run(ctx context.Context, t targets) error
	// ready reports, once the producer is done, whether the faults may
	// stop and the drain begin.
	ready(ctx context.Context, n names) (bool, string, error)
}

// targets are what a schedule may hit.
type targets struct {
	workers []*proc // slots: a restart keeps the slot
	relay   *proc   // nil in the two-phase phase
	faults  *faultCounter
}

// deck deals the fault kinds of a mode from a shuffled deck until every
// order took effect (see injector).
type deck struct {
	e      *env
	mode   string
	orders int
	every  time.Duration
	dealt  chan struct{}
}

func (d *deck) String() string { return fmt.Sprintf("a fault every ~%s", d.every) }

func (d *deck) run(ctx context.Context, t targets) error {
	// A restart takes seconds, the other faults none: the deck holds
	// more of those so that they are frequent too.
	kinds := []string{faultWorkerKill, faultWorkerKill, faultWorkerKill, faultTerminate, faultRestartFast}
	if d.mode == Transactional {
		kinds = []string{faultWorkerKill, faultWorkerKill, faultWorkerKill, faultRelayKill, faultTerminate, faultTerminate,
			faultListenKill, faultRestartFast, faultRestartCrash}
	}
	in := &injector{cluster: d.e.cluster, admin: d.e.admin, workers: t.workers, relay: t.relay,
		faults: t.faults, every: d.every, kinds: kinds, progress: d.e.progress(), dealt: d.dealt}
	return in.run(ctx)
}

// ready: faults go on until every order took effect, so they hit
// redeliveries and the relay's backlog too, and until every kind was
// injected.
func (d *deck) ready(ctx context.Context, n names) (bool, string, error) {
	select {
	case <-d.dealt:
	default:
		return false, "not every fault kind injected yet", nil
	}
	return d.e.settled(ctx, d.mode, n, d.orders)
}

func (e *env) say(format string, args ...any) {
	fmt.Fprintf(e.config.Out, "chaos: "+format+"\n", args...)
}

// phase runs one mode from an empty schema to a tallied ledger.
func (e *env) phase(parent context.Context, mode string, orders int, duration time.Duration, sched schedule) (_ *Phase, err error) {
	ctx, cancel := context.WithTimeout(parent, e.config.Timeout)
	defer cancel()
	start := time.Now()
	n := namesFor(e.run, mode)
	e.say("%s phase: %d orders over %s, %s", mode, orders, duration, sched)

	conn, err := amqp091.Dial(e.config.AMQPURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	defer conn.Close()
	if err := e.setup(ctx, mode, n, conn); err != nil {
		return nil, err
	}
	if !e.config.Keep {
		defer e.cleanup(context.WithoutCancel(ctx), mode, n, conn)
	}
	var jan *sweeper
	if e.partitioned {
		if jan, err = e.seedExpired(ctx, n, duration); err != nil {
			return nil, err
		}
	}

	faults := newFaultCounter()
	ph := &Phase{Mode: mode, Orders: orders}
	if mode == TwoPhase {
		ph.Policy = e.config.TwoPhasePolicy.String()
	}
	defer func() {
		ph.Faults, ph.Backends, ph.Notes = faults.snapshot()
		ph.Elapsed = time.Since(start)
	}()
	sup := &supervisor{exe: e.exe, logDir: e.config.LogDir, faults: faults, mode: mode}
	defer sup.stopAll(5 * time.Second)
	base := spec{
		Mode: mode, Names: n, DSN: "", LedgerPath: e.ledgerPath, AMQPURL: e.config.AMQPURL,
		ExitAfterCommit: e.config.ExitAfterCommit, Lease: e.config.Lease, EffectDelay: e.config.EffectDelay,
		Policy: e.config.TwoPhasePolicy,
	}
	if mode == Transactional {
		base.Batch = e.config.Batch
		ph.Batch = e.config.Batch
	}
	if e.partitioned {
		base.Partitioned, base.Retention, ph.Surface = true, partitionedRetention, surfacePartitioned
	}
	workerSpecs := make([]spec, e.config.Workers)
	for i := range workerSpecs {
		s := base
		s.Role, s.Name = roleWorker, fmt.Sprintf("worker-%d", i+1)
		s.DSN = e.dsn("chaos-" + s.Name)
		if e.partitioned && i%2 == 1 {
			s.Names.Inbox = "public." + n.Inbox // one table, two spellings: one lock
		}
		workerSpecs[i] = s
	}
	relaySpec := base
	relaySpec.Role, relaySpec.Name, relaySpec.DSN = roleRelay, "relay", e.dsn("chaos-relay")

	var workers []*proc
	var relay *proc
	startAll := func() error {
		workers = workers[:0]
		for _, s := range workerSpecs {
			p, err := sup.start(s)
			if err != nil {
				return err
			}
			workers = append(workers, p)
		}
		if mode == Transactional {
			if relay, err = sup.start(relaySpec); err != nil {
				return err
			}
		}
		return nil
	}
	if err := startAll(); err != nil {
		return ph, err
	}

	// Workers are replaced by restarts; the schedule always sees the
	// current slots (a proc is a slot, not a process).
	tg := targets{workers: append([]*proc(nil), workers...), relay: relay, faults: faults}
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	var faultErr error
	var faultWG sync.WaitGroup
	faultDone := make(chan struct{})
	faultWG.Add(1)
	go func() {
		defer faultWG.Done()
		defer close(faultDone)
		faultErr = sched.run(faultCtx, tg)
	}()
	if jan != nil {
		faultWG.Add(1)
		go func() { defer faultWG.Done(); jan.run(faultCtx) }()
	}
	stopInjector := func() error {
		stopFaults()
		faultWG.Wait()
		return faultErr
	}

	pub, err := amqp.NewPublisher(amqpConfig(e.config.AMQPURL), watermill.NopLogger{})
	if err != nil {
		return ph, err
	}
	defer pub.Close()
	uuids, messages, err := produce(ctx, pub, n.Orders, orders, duration, e.config.Duplicates)
	ph.Messages = messages
	if err != nil {
		_ = stopInjector()
		return ph, fmt.Errorf("chaos: producer: %w", err)
	}
	e.say("%s phase: %d messages published for %d orders in %s", mode, messages, orders, time.Since(start).Round(time.Second))

	if err := e.waitFor(ctx, mode+" phase: the fault schedule ("+sched.String()+") to be done", func(ctx context.Context) (bool, string, error) {
		select {
		case <-faultDone:
			return true, "", nil // complete, or failed: stopInjector reports it
		default:
		}
		return sched.ready(ctx, n)
	}); err != nil {
		_ = stopInjector()
		return ph, err
	}
	if err := stopInjector(); err != nil {
		return ph, fmt.Errorf("chaos: fault injection: %w", err)
	}
	if err := waitReady(ctx, e.admin, "the private cluster"); err != nil {
		return ph, err
	}

	// Drain: with no more faults, let the queues and the outbox empty,
	// stop the workers gracefully (what they held goes back to the queue),
	// and look again; a redelivery that arrived late is processed by a
	// fresh set of workers before the ledger is read.
	for round := 1; ; round++ {
		// A queue's count leaves out the deliveries a worker holds, so the
		// queues must stay empty longer than one delivery's retries take.
		var quietSince time.Time
		if err := e.waitFor(ctx, mode+" phase: queues and outbox empty", func(ctx context.Context) (bool, string, error) {
			ok, status, err := e.drained(ctx, mode, n, conn)
			if !ok || err != nil {
				quietSince = time.Time{}
				return false, status, err
			}
			if quietSince.IsZero() {
				quietSince = time.Now()
			}
			return time.Since(quietSince) >= quietPeriod, status, nil
		}); err != nil {
			return ph, err
		}
		var wg sync.WaitGroup
		for _, p := range workers {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(30 * time.Second) }()
		}
		wg.Wait()
		if relay != nil {
			if err := e.waitFor(ctx, "the relay to empty the outbox", func(ctx context.Context) (bool, string, error) {
				backlog, err := e.count(ctx, e.admin, `SELECT count(*) FROM `+n.Outbox)
				return backlog == 0, fmt.Sprintf("outbox %d", backlog), err
			}); err != nil {
				return ph, err
			}
			relay.stop(30 * time.Second)
		}
		sup.stopAll(5 * time.Second)
		done, status, err := e.drained(ctx, mode, n, conn)
		if err != nil {
			return ph, err
		}
		if done {
			break
		}
		if round == 5 {
			return ph, fmt.Errorf("chaos: %s phase did not drain after %d rounds: %s", mode, round, status)
		}
		e.say("%s phase: drain round %d found %s; running the workers again", mode, round, status)
		if err := startAll(); err != nil {
			return ph, err
		}
	}

	if ph.Poisoned, err = queueDepth(conn, queueName(n.Poison)); err != nil {
		return ph, err
	}
	if mode == Transactional {
		dead := outbox.DeadLetterTableName(n.Outbox)
		if err := repository.ValidateTableName(dead); err != nil {
			return ph, err
		}
		if ph.DeadLetters, err = e.count(ctx, e.admin, `SELECT count(*) FROM `+dead); err != nil {
			return ph, fmt.Errorf("chaos: counting dead letters: %w", err)
		}
	}
	if jan != nil {
		if ph.Janitor, err = jan.finish(ctx); err != nil {
			return ph, err
		}
	}
	if err := e.tally(ctx, mode, n, uuids, ph); err != nil {
		return ph, err
	}
	if e.afterTally != nil {
		if err := e.afterTally(ctx, n); err != nil {
			return ph, err
		}
	}
	e.say("%s phase done in %s", mode, time.Since(start).Round(time.Second))
	return ph, nil
}

func (e *env) setup(ctx context.Context, mode string, n names, conn *amqp091.Connection) error {
	if err := n.validate(); err != nil {
		return err
	}
	repo, err := inboxRepository(e.admin, spec{Names: n, Partitioned: e.partitioned})
	if err != nil {
		return err
	}
	if err := repo.Migrate(ctx); err != nil {
		return fmt.Errorf("chaos: inbox schema: %w", err)
	}
	// The ledgers are append-only on purpose: no unique constraint, so a
	// doubled effect is a second row to count, not an error that hides it.
	ledgerDDL := func(table string) string {
		return `CREATE TABLE IF NOT EXISTS ` + table + ` (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			order_id TEXT NOT NULL, process TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())`
	}
	sqliteLedgerDDL := `CREATE TABLE IF NOT EXISTS ` + n.Effects + ` (id INTEGER PRIMARY KEY AUTOINCREMENT,
		order_id TEXT NOT NULL, process TEXT NOT NULL, at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`
	if mode == Transactional {
		ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: n.Outbox})
		if err != nil {
			return err
		}
		if err := ob.Migrate(ctx, e.admin); err != nil {
			return fmt.Errorf("chaos: outbox schema: %w", err)
		}
		for _, t := range []string{n.Effects, n.Receipts} {
			if _, err := e.admin.ExecContext(ctx, ledgerDDL(t)); err != nil {
				return fmt.Errorf("chaos: ledger table: %w", err)
			}
		}
	} else if _, err := e.ledger.ExecContext(ctx, sqliteLedgerDDL); err != nil {
		return fmt.Errorf("chaos: ledger table: %w", err)
	}
	// Queues exist before anything is published to their exchanges.
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	cfg := amqpConfig(e.config.AMQPURL)
	for _, topic := range []string{n.Orders, n.Payments, n.Poison} {
		if err := cfg.TopologyBuilder.BuildTopology(ch, queueName(topic), topic, cfg, watermill.NopLogger{}); err != nil {
			return fmt.Errorf("chaos: declaring %s: %w", topic, err)
		}
	}
	return nil
}

func (e *env) cleanup(ctx context.Context, mode string, n names, conn *amqp091.Connection) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var errs []error
	for _, t := range []string{n.Inbox, n.Outbox, outbox.DeadLetterTableName(n.Outbox), n.Effects, n.Receipts} {
		_, err := e.admin.ExecContext(ctx, `DROP TABLE IF EXISTS `+t)
		errs = append(errs, err)
	}
	_, err := e.admin.ExecContext(ctx, `DROP FUNCTION IF EXISTS `+n.Outbox+`_notify()`)
	errs = append(errs, err)
	// The store records applied migrations per table ("<line>:<table>")
	// in one table; forget the dropped inbox's, if that table exists.
	_, err = e.admin.ExecContext(ctx, `DO $$ BEGIN
		IF to_regclass('watermill_idempotent_migrations') IS NOT NULL THEN
			DELETE FROM watermill_idempotent_migrations WHERE subject LIKE '%:`+n.Inbox+`';
		END IF;
	END $$`)
	errs = append(errs, err)
	if mode == TwoPhase {
		_, err := e.ledger.ExecContext(ctx, `DROP TABLE IF EXISTS `+n.Effects)
		errs = append(errs, err)
	}
	for _, topic := range []string{n.Orders, n.Payments, n.Poison} {
		if conn == nil { // a keyed scenario of RunSurfaces: no broker
			break
		}
		if ch, err := conn.Channel(); err == nil {
			_, err = ch.QueueDelete(queueName(topic), false, false, false)
			errs = append(errs, err, ch.ExchangeDelete(topic, false, false))
			_ = ch.Close()
		} else {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		e.say("cleanup of %s: %v", mode, err)
	}
}

// produce publishes orders over duration; a fraction dup of them is
// published twice with the same UUID and payload, half right away and
// half later in the stream. It returns each order's UUID and the number
// of messages published.
func produce(ctx context.Context, pub message.Publisher, topic string, orders int, duration time.Duration, dup float64) (map[string]string, int, error) {
	uuids := make(map[string]string, orders)
	var later []*message.Message
	messages := 0
	publish := func(m *message.Message) error {
		messages++
		return pub.Publish(topic, m)
	}
	start := time.Now()
	for i := range orders {
		o := order{OrderID: fmt.Sprintf("o-%06d", i+1), Amount: 100 + (i*1373)%9000}
		payload, _ := json.Marshal(o)
		uuid := watermill.NewUUID()
		uuids[o.OrderID] = uuid
		if err := publish(message.NewMessage(uuid, payload)); err != nil {
			return uuids, messages, err
		}
		if mrand.Float64() < dup {
			copy := message.NewMessage(uuid, payload)
			if mrand.IntN(2) == 0 {
				if err := publish(copy); err != nil {
					return uuids, messages, err
				}
			} else {
				later = append(later, copy)
			}
		}
		if len(later) > 0 && mrand.Float64() < dup/2 {
			if err := publish(later[0]); err != nil {
				return uuids, messages, err
			}
			later = later[1:]
		}
		next := start.Add(duration * time.Duration(i+1) / time.Duration(orders))
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return uuids, messages, ctx.Err()
			case <-time.After(d):
			}
		}
	}
	for _, m := range later {
		if err := publish(m); err != nil {
			return uuids, messages, err
		}
	}
	return uuids, messages, nil
}

// waitFor polls cond every 250 ms until it holds or ctx ends, printing
// its status every 10 s.
func (e *env) waitFor(ctx context.Context, what string, cond func(context.Context) (bool, string, error)) error {
	lastSay := time.Now()
	var status string
	var lastErr error
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, s, err := cond(qctx)
		cancel()
		if err == nil && ok {
			return nil
		}
		if s != "" && err == nil {
			status = s
		}
		lastErr = err // errors are expected while the server restarts
		if time.Since(lastSay) > 10*time.Second {
			e.say("waiting for %s: %s", what, status)
			lastSay = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: waiting for %s: %w (last status: %s; last error: %v)", what, ctx.Err(), status, lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (e *env) count(ctx context.Context, db *sql.DB, query string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, query).Scan(&n)
	return n, err
}

// settled reports whether every order took effect (transactional: an
// effect and a receipt each, outbox empty; two-phase: a completed record
// or one whose lease expired, which needs intervention).
func (e *env) settled(ctx context.Context, mode string, n names, orders int) (bool, string, error) {
	if mode == Transactional {
		var effects, receipts, backlog int
		err := e.admin.QueryRowContext(ctx, `SELECT
			(SELECT count(DISTINCT order_id) FROM `+n.Effects+`),
			(SELECT count(DISTINCT order_id) FROM `+n.Receipts+`),
			(SELECT count(*) FROM `+n.Outbox+`)`).Scan(&effects, &receipts, &backlog)
		status := fmt.Sprintf("%d/%d orders took effect, %d/%d receipts, outbox %d", effects, orders, receipts, orders, backlog)
		return err == nil && effects == orders && receipts == orders && backlog == 0, status, err
	}
	var settled int
	err := e.admin.QueryRowContext(ctx, `SELECT count(*) FROM `+n.Inbox+` WHERE state = 'completed' OR lease_until < now()`).Scan(&settled)
	return err == nil && settled == orders, fmt.Sprintf("%d/%d keys completed or awaiting intervention", settled, orders), err
}

// drained reports whether no message waits in the phase's queues and the
// outbox is empty. (A queue's count excludes deliveries held
// unacknowledged; the drain loop stops the workers to return those.)
func (e *env) drained(ctx context.Context, mode string, n names, conn *amqp091.Connection) (bool, string, error) {
	orders, err := queueDepth(conn, queueName(n.Orders))
	if err != nil {
		return false, "", err
	}
	payments, err := queueDepth(conn, queueName(n.Payments))
	if err != nil {
		return false, "", err
	}
	backlog := 0
	if mode == Transactional {
		if backlog, err = e.count(ctx, e.admin, `SELECT count(*) FROM `+n.Outbox); err != nil {
			return false, "", err
		}
	}
	status := fmt.Sprintf("%d orders and %d payments queued, outbox %d", orders, payments, backlog)
	return orders == 0 && payments == 0 && backlog == 0, status, nil
}

func queueDepth(conn *amqp091.Connection, queue string) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, fmt.Errorf("chaos: inspecting queue %s: %w", queue, err)
	}
	return q.Messages, nil
}

// tally reads the ledgers: per order, how many effects (and receipts)
// were applied.
func (e *env) tally(ctx context.Context, mode string, n names, uuids map[string]string, ph *Phase) error {
	perOrder := func(db *sql.DB, table string) (map[string]int, error) {
		rows, err := db.QueryContext(ctx, `SELECT order_id, count(*) FROM `+table+` GROUP BY order_id`)
		if err != nil {
			return nil, fmt.Errorf("chaos: reading ledger %s: %w", table, err)
		}
		defer rows.Close()
		m := map[string]int{}
		for rows.Next() {
			var id string
			var c int
			if err := rows.Scan(&id, &c); err != nil {
				return nil, err
			}
			m[id] = c
		}
		return m, rows.Err()
	}
	tallyOf := func(m map[string]int) Tally { return tallyOrders(uuids, m) }

	if mode == Transactional {
		effects, err := perOrder(e.admin, n.Effects)
		if err != nil {
			return err
		}
		receipts, err := perOrder(e.admin, n.Receipts)
		if err != nil {
			return err
		}
		ph.Effects = tallyOf(effects)
		r := tallyOf(receipts)
		ph.Receipts = &r
		return nil
	}
	effects, err := perOrder(e.ledger, n.Effects)
	if err != nil {
		return err
	}
	ph.Effects = tallyOf(effects)
	// Keys left in progress are the deliveries Intervene routed to an
	// operator: the attempt died after claiming, before completing.
	rows, err := e.admin.QueryContext(ctx, `SELECT dedup_key FROM `+n.Inbox+` WHERE state = 'in_progress'`)
	if err != nil {
		return fmt.Errorf("chaos: reading two-phase records: %w", err)
	}
	defer rows.Close()
	inProgress := map[string]bool{}
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			return err
		}
		inProgress[key] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for id, uuid := range uuids {
		if !inProgress[uuid] {
			if effects[id] == 0 {
				ph.UnexplainedLost++
			}
			continue
		}
		ph.Intervention++
		if effects[id] > 0 {
			ph.InterventionApplied++
		}
	}
	return nil
}

// tallyOrders counts, over the orders (the keys of ids), how many
// effects the ledger m (order → effects) holds for each.
func tallyOrders[V any](ids map[string]V, m map[string]int) Tally {
	var t Tally
	for id := range ids {
		switch c := m[id]; {
		case c == 0:
			t.Lost++
			t.LostOrders = appendSample(t.LostOrders, id)
		case c > 1:
			t.Doubled++
			t.Applied++
			t.DoubledOrders = appendSample(t.DoubledOrders, id)
		default:
			t.Applied++
		}
	}
	for id := range m {
		if _, ok := ids[id]; !ok {
			t.Unknown++
		}
	}
	return t
}

func appendSample(s []string, id string) []string {
	if len(s) < 10 {
		return append(s, id)
	}
	return s
}

// Tally is one ledger's count over the orders.
type Tally struct {
	Applied int // orders with at least one effect
	Doubled int // orders with more than one effect
	Lost    int // orders with none
	Unknown int // ledger rows for orders never published (must be 0)

	DoubledOrders, LostOrders []string // up to 10 of each
}

// Phase is what one mode's run measured.
type Phase struct {
	Mode     string
	Policy   string // two-phase: the expired-lease policy
	Batch    int    // transactional: group commit's MaxMessages, 0 when off
	Orders   int    // orders published
	Messages int    // messages published, producer duplicates included
	Faults   map[string]int
	Backends map[string]int // backends terminated, by fault kind
	Notes    []string       // unexpected child exits and the like
	Effects  Tally
	Receipts *Tally // transactional: the payments' arrival behind the outbox relay
	// Two-phase: keys left in progress (routed to intervention), how many
	// of those had their effect applied, and orders with no effect and no
	// intervention record (must be 0).
	Intervention, InterventionApplied, UnexplainedLost int
	Poisoned                                           int // messages on the poison queue
	DeadLetters                                        int // transactional: outbox rows the relay gave up on
	Elapsed                                            time.Duration

	// Surface names the API a RunSurfaces scenario drives (once,
	// httpidem, the partitioned inbox); empty for Run's phases. A keyed
	// scenario has no receipts: its Orders are keys, its Messages the
	// calls made (duplicates included, retries not).
	Surface string
	// Wrong counts answers that are not the effect's: a success whose
	// value is no effect in the ledger (the caller was told it happened
	// and it did not), or a permanent error other than intervention.
	Wrong int
	// Janitor is the partitioned inbox's cleanup under the faults.
	Janitor *JanitorTally
	// SharedFaults: this phase ran at once with the one before it, under
	// the same faults (Faults counts them once for both).
	SharedFaults bool
}

// OK reports whether the phase kept its promise: transactional, 0
// doubled and 0 lost effects and receipts and nothing poisoned; two-phase
// with Intervene, 0 doubled and every missing effect accounted for by an
// intervention record; two-phase with Reclaim, 0 lost (doubles are that
// policy's documented price).
func (p Phase) OK() bool {
	if p.Effects.Unknown != 0 || p.Wrong != 0 || p.UnexplainedLost != 0 || (p.Janitor != nil && !p.Janitor.OK()) {
		return false
	}
	if p.Mode == TwoPhase && p.Policy == idempotency.Reclaim.String() {
		// Reclaim re-runs an effect whose attempt died: at least once.
		return p.Effects.Lost == 0
	}
	if p.Effects.Doubled != 0 {
		return false
	}
	if p.Mode == Transactional {
		if r := p.Receipts; r == nil && p.Surface == "" || r != nil && (r.Doubled != 0 || r.Lost != 0 || r.Unknown != 0) {
			return false
		}
		return p.Effects.Lost == 0 && p.Poisoned == 0 && p.DeadLetters == 0
	}
	return true
}

func (p Phase) label() string {
	if p.Surface != "" {
		if p.Policy != "" {
			return p.Surface + " (" + p.Policy + ")"
		}
		return p.Surface
	}
	if p.Policy != "" {
		return p.Mode + " (" + p.Policy + ")"
	}
	if p.Batch > 1 {
		return fmt.Sprintf("%s (group commit, batch %d)", p.Mode, p.Batch)
	}
	return p.Mode
}

// Report is what a run measured.
type Report struct {
	Run, Cluster, LogDir string
	Started              time.Time
	Elapsed              time.Duration
	Workers              int
	Phases               []Phase
	// Surfaces: a RunSurfaces report, whose ledger table differs.
	Surfaces bool
}

// OK reports whether every phase kept its promise.
func (r *Report) OK() bool {
	for _, p := range r.Phases {
		if !p.OK() {
			return false
		}
	}
	return len(r.Phases) > 0
}

// printFaults writes the table of faults injected per phase.
func printFaults(w io.Writer, phases []Phase) {
	fmt.Fprintf(w, "| mode | fault injected | count |\n|---|---|---:|\n")
	for i, p := range phases {
		if p.SharedFaults {
			continue
		}
		label := p.label()
		if i+1 < len(phases) && phases[i+1].SharedFaults {
			label += " and the phases after it, at once"
		}
		for _, kind := range faultOrder {
			c, ok := p.Faults[kind]
			if !ok {
				continue
			}
			extra := ""
			if b := p.Backends[kind]; b > 0 && kind == faultTerminate {
				extra = fmt.Sprintf(" (%d backends)", b)
			}
			fmt.Fprintf(w, "| %s | %s | %d%s |\n", label, kind, c, extra)
		}
	}
}

// Print writes the fault table and the ledger table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "\nchaos run %s, %s, %d worker processes per queue, private PostgreSQL %s, %s in all\n\n",
		r.Run, r.Started.Format("2006-01-02 15:04 UTC"), r.Workers, r.Cluster, r.Elapsed.Round(time.Second))
	printFaults(w, r.Phases)
	if r.Surfaces {
		printSurfaces(w, r.Phases)
		return
	}
	fmt.Fprintf(w, "\n| mode | orders | messages (with duplicates) | effects doubled | effects lost | receipts doubled | receipts lost | needs intervention (effect applied) | poisoned | time | verdict |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range r.Phases {
		rd, rl, iv := "–", "–", "–"
		if p.Receipts != nil {
			rd, rl = fmt.Sprint(p.Receipts.Doubled), fmt.Sprint(p.Receipts.Lost)
		}
		if p.Mode == TwoPhase {
			iv = fmt.Sprintf("%d (%d)", p.Intervention, p.InterventionApplied)
		}
		verdict := "OK"
		if !p.OK() {
			verdict = "FAILED"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %s | %s | %s | %d | %s | %s |\n", p.label(), p.Orders, p.Messages,
			p.Effects.Doubled, p.Effects.Lost, rd, rl, iv, p.Poisoned, p.Elapsed.Round(time.Second), verdict)
	}
	for _, p := range r.Phases {
		var lines []string
		if len(p.Effects.DoubledOrders) > 0 {
			lines = append(lines, "doubled: "+strings.Join(p.Effects.DoubledOrders, ", "))
		}
		if p.Mode == Transactional && len(p.Effects.LostOrders) > 0 {
			lines = append(lines, "lost: "+strings.Join(p.Effects.LostOrders, ", "))
		}
		if p.Effects.Unknown > 0 {
			lines = append(lines, fmt.Sprintf("%d ledger rows for orders never published", p.Effects.Unknown))
		}
		if p.DeadLetters > 0 {
			lines = append(lines, fmt.Sprintf("%d outbox rows in the dead-letter table", p.DeadLetters))
		}
		if p.UnexplainedLost > 0 {
			lines = append(lines, fmt.Sprintf("%d orders without effect and without an intervention record", p.UnexplainedLost))
		}
		lines = append(lines, p.Notes...)
		for _, l := range lines {
			fmt.Fprintf(w, "%s: %s\n", p.Mode, l)
		}
	}
	fmt.Fprintln(w)
}
