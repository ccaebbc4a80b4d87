package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/watermill-idempotent/outbox"
)

// Fault kinds of the failover run.
const (
	faultReplicaStall = "replica stopped (SIGSTOP), then resumed"
	faultPrimaryCrash = "primary SIGKILLed with its processes"
	faultPromote      = "replica promoted"
)

// Processes the failover run stops to make the replica lag.
const (
	LagWALReceiver = "walreceiver" // the replica's WAL receiver: WAL already sent waits in socket buffers
	LagWALSender   = "walsender"   // the primary's WAL sender: nothing more leaves the primary
)

// FailoverConfig is one failover run: for each replication mode, a
// primary and a streaming replica on private ports, the transactional
// phase of the fault suite (workers, relay, duplicates, the ledger) on a
// multi-host DSN, and one failover mid-stream: the replica is stopped
// for Stall and resumed (the commit stall a synchronous replica adds),
// later stopped again for Lag, the primary is SIGKILLed with all its
// processes, the replica resumed and, PromoteAfter later, promoted. Then
// Service, if set, measures how long an in-process inbox, relay and
// janitor take to resume on the new primary on each driver.
type FailoverConfig struct {
	// Modes are the replication modes to run, in order (Async, Sync,
	// RemoteApply). Default (nil): all three; empty: none (Service only).
	Modes []string
	// Orders, Duration, Workers, Duplicates, ExitAfterCommit: as in
	// Config (the transactional phase).
	Orders          int
	Duration        time.Duration
	Workers         int
	Duplicates      float64
	ExitAfterCommit float64
	// Stall is how long the replica is stopped, at 30% of Duration, to
	// measure the stall of commits. Default: 3 s.
	Stall time.Duration
	// Lag is how long the replica is stopped, at 60% of Duration, before
	// the primary is killed. Default: 3 s.
	Lag time.Duration
	// LagProcess is the process stopped: LagWALReceiver (default) or
	// LagWALSender.
	LagProcess string
	// PromoteAfter is the pause between the kill and the promotion (a
	// failover manager's detection time). Default: 1 s.
	PromoteAfter time.Duration
	// Service runs the reconnect measurement after the modes.
	Service bool
	// Timeout bounds each mode. Default: 5 minutes.
	Timeout time.Duration

	// PGVersion, PrimaryPort and ReplicaPort name the private pair
	// (clusters ha-a and ha-b). Defaults: the newest PostgreSQL,
	// DefaultFailoverPrimaryPort, DefaultFailoverReplicaPort.
	PGVersion                string
	PrimaryPort, ReplicaPort int
	// AMQPURL, Out, LogDir: as in Config.
	AMQPURL string
	Out     io.Writer
	LogDir  string
}

// FailoverPreset is the configuration of -config failover: about a
// minute per replication mode on two cores.
func FailoverPreset() FailoverConfig {
	return FailoverConfig{
		Orders: 1500, Duration: 25 * time.Second, Workers: 3, Duplicates: 0.2, ExitAfterCommit: 0.01,
		Service: true,
	}
}

func (c *FailoverConfig) setDefaults() {
	if c.Modes == nil {
		c.Modes = []string{Async, Sync, RemoteApply}
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Stall == 0 {
		c.Stall = 3 * time.Second
	}
	if c.Lag == 0 {
		c.Lag = 3 * time.Second
	}
	if c.LagProcess == "" {
		c.LagProcess = LagWALReceiver
	}
	if c.PromoteAfter == 0 {
		c.PromoteAfter = time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Minute
	}
	if c.PGVersion == "" {
		c.PGVersion = getenv(VersionEnv, newestPostgres())
	}
	if c.PrimaryPort == 0 {
		c.PrimaryPort = DefaultFailoverPrimaryPort
	}
	if c.ReplicaPort == 0 {
		c.ReplicaPort = DefaultFailoverReplicaPort
	}
	if c.AMQPURL == "" {
		c.AMQPURL = getenv(AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/")
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
}

// Validate reports every problem with the configuration at once.
func (c FailoverConfig) Validate() error {
	var errs []error
	for _, m := range c.Modes {
		if m != Async && m != Sync && m != RemoteApply {
			errs = append(errs, fmt.Errorf("chaos: unknown replication mode %q (%s, %s or %s)", m, Async, Sync, RemoteApply))
		}
	}
	if c.Orders < 1 && len(c.Modes) > 0 {
		errs = append(errs, errors.New("chaos: Orders must be positive"))
	}
	if c.Workers < 2 {
		errs = append(errs, errors.New("chaos: at least 2 workers are needed to compete"))
	}
	if c.Duration <= 0 || c.Stall <= 0 || c.Lag <= 0 || c.PromoteAfter < 0 {
		errs = append(errs, errors.New("chaos: Duration, Stall and Lag must be positive"))
	}
	if c.Stall+c.Lag > c.Duration/3 {
		errs = append(errs, fmt.Errorf("chaos: Stall and Lag (%s) must fit in a third of Duration (%s)", c.Stall+c.Lag, c.Duration))
	}
	if c.LagProcess != LagWALReceiver && c.LagProcess != LagWALSender {
		errs = append(errs, fmt.Errorf("chaos: LagProcess is %s or %s", LagWALReceiver, LagWALSender))
	}
	for _, port := range []int{c.PrimaryPort, c.ReplicaPort} {
		if port == sharedPort || port == DefaultPort {
			errs = append(errs, fmt.Errorf("chaos: the failover pair must not use port %d (shared cluster or the fault suite's)", port))
		}
	}
	if c.PrimaryPort == c.ReplicaPort {
		errs = append(errs, errors.New("chaos: the primary and the replica need two ports"))
	}
	if c.PGVersion == "" {
		errs = append(errs, fmt.Errorf("%w: no PostgreSQL server under /usr/lib/postgresql (set %s)", ErrPrerequisite, VersionEnv))
	}
	return errors.Join(errs...)
}

// FailoverResult is what one replication mode measured.
type FailoverResult struct {
	Replication string
	Phase       Phase // the ledger: effects and receipts doubled and lost
	// EffectsOnOldPrimary counts the lost orders whose effect the old
	// primary holds when started again on its own: committed and
	// acknowledged to the broker, then lost with the failover. Every lost
	// order should be one of them.
	EffectsOnOldPrimary int
	// ProbeAcked and ProbeLost count the probe's committed inserts and
	// those missing on the new primary.
	ProbeAcked, ProbeLost int
	// LagBytes is the WAL the replica had not flushed when the primary
	// was killed (pg_stat_replication on the primary, just before).
	LagBytes int64
	// Stall is the longest probe commit while the replica was stopped
	// for StallFor; StallCommits counts the commits that finished then.
	Stall, StallFor time.Duration
	StallCommits    int
	// Outage is the probe's longest wait between two commits across the
	// failover; PromoteTook how long pg_ctl promote took;
	// FirstCommitAfterKill when the probe committed first after the kill
	// (the server accepts writes before pg_ctl promote returns);
	// FirstEffectAfterPromote and FirstReceiptAfter when the inbox and
	// the receipts behind the relay committed first after the promotion.
	Outage, PromoteTook                                              time.Duration
	FirstCommitAfterKill, FirstEffectAfterPromote, FirstReceiptAfter time.Duration
}

// OK reports whether the mode kept its promise: with synchronous
// replication nothing acknowledged is lost and nothing doubled; with
// asynchronous replication every lost order is one the old primary had
// committed (the documented bound), and nothing is doubled.
func (r FailoverResult) OK() bool {
	p := r.Phase
	clean := p.Effects.Doubled == 0 && p.Effects.Unknown == 0 && p.Poisoned == 0 && p.DeadLetters == 0 &&
		p.Receipts != nil && p.Receipts.Doubled == 0
	if r.Replication == Async {
		return clean && p.Effects.Lost == r.EffectsOnOldPrimary
	}
	return clean && p.Effects.Lost == 0 && p.Receipts.Lost == 0 && r.ProbeLost == 0
}

// FailoverReport is what a failover run measured.
type FailoverReport struct {
	Run, Pair, LogDir string
	Started           time.Time
	Elapsed           time.Duration
	Config            FailoverConfig
	Modes             []FailoverResult
	Services          []ServiceResult
}

// OK reports whether every mode and every service kept its promise.
func (r *FailoverReport) OK() bool {
	for _, m := range r.Modes {
		if !m.OK() {
			return false
		}
	}
	for _, s := range r.Services {
		if !s.OK() {
			return false
		}
	}
	return len(r.Modes)+len(r.Services) > 0
}

// RunFailover runs the failover measurement (see FailoverConfig) and
// stops the private pair before returning.
func RunFailover(ctx context.Context, config FailoverConfig) (*FailoverReport, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	exe, err := prerequisites(config.AMQPURL)
	if err != nil {
		return nil, err
	}
	pr := newPair(config.PGVersion, config.PrimaryPort, config.ReplicaPort)
	unlock, err := lockCluster(pr.a, config.Out)
	if err != nil {
		return nil, err
	}
	defer unlock()
	defer stopOnReturn(ctx, config.Out, "the private pair", pr.stop)
	run, err := newRun("f", &config.LogDir)
	if err != nil {
		return nil, err
	}
	report := &FailoverReport{Run: run, Pair: fmt.Sprintf("%s primary, %s replica", pr.a, pr.b), LogDir: config.LogDir,
		Started: time.Now().UTC(), Config: config}
	fmt.Fprintf(config.Out, "chaos: failover run %s, %s, child logs in %s\n", run, report.Pair, config.LogDir)
	defer func() { report.Elapsed = time.Since(report.Started) }()
	for _, mode := range config.Modes {
		res, err := runFailoverMode(ctx, config, exe, pr, run+mode[:2], mode)
		if res != nil {
			report.Modes = append(report.Modes, *res)
		}
		if err != nil {
			return report, fmt.Errorf("chaos: %s failover: %w", mode, err)
		}
	}
	if config.Service {
		for _, driver := range []string{DriverStdlib, DriverPgxpool} {
			res, err := runService(ctx, config, pr, driver)
			if res != nil {
				report.Services = append(report.Services, *res)
			}
			if err != nil {
				return report, fmt.Errorf("chaos: service on %s: %w", driver, err)
			}
		}
	}
	return report, nil
}

func runFailoverMode(parent context.Context, config FailoverConfig, exe string, pr pair, run, mode string) (*FailoverResult, error) {
	ctx, cancel := context.WithTimeout(parent, config.Timeout)
	defer cancel()
	say := func(format string, args ...any) { fmt.Fprintf(config.Out, "chaos: "+mode+": "+format+"\n", args...) }
	say("resetting the pair (primary %s, replica %s)", pr.a, pr.b)
	if err := pr.reset(ctx, mode); err != nil {
		return nil, err
	}
	admin, err := openDB(pr.DSN("chaos-admin"), 4)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := waitReady(ctx, admin, "the primary"); err != nil {
		return nil, err
	}
	probeTable := "chaos_" + run + "_probe"
	if _, err := admin.ExecContext(ctx, `CREATE TABLE `+probeTable+` (seq BIGINT PRIMARY KEY)`); err != nil {
		return nil, err
	}
	pdb, err := openDB(pr.DSN("chaos-probe"), 1)
	if err != nil {
		return nil, err
	}
	defer pdb.Close()
	pb := &probe{db: pdb, table: probeTable}
	probeCtx, stopProbe := context.WithCancel(ctx)
	defer stopProbe()
	var probeWG sync.WaitGroup
	probeWG.Add(1)
	go func() { defer probeWG.Done(); pb.run(probeCtx) }()

	cfg := Config{Workers: config.Workers, ExitAfterCommit: config.ExitAfterCommit, Duplicates: config.Duplicates,
		Timeout: config.Timeout, AMQPURL: config.AMQPURL, Out: config.Out, LogDir: config.LogDir, PGVersion: config.PGVersion}
	cfg.setDefaults()
	e := &env{config: cfg, exe: exe, run: run, cluster: pr.a, admin: admin, dsnFor: pr.DSN}
	fo := &failover{pair: pr, mode: mode, config: config, say: say}
	res := &FailoverResult{Replication: mode}
	onNew := map[string]map[string]bool{}
	e.afterTally = func(ctx context.Context, n names) error {
		for _, t := range []string{n.Effects, n.Receipts} {
			set, err := orderSet(ctx, admin, t)
			if err != nil {
				return err
			}
			onNew[t] = set
		}
		first := func(table string) (time.Duration, error) {
			var at sql.NullTime
			err := admin.QueryRowContext(ctx, `SELECT min(at) FROM `+table+` WHERE at > $1`, fo.promotedAt).Scan(&at)
			if !at.Valid {
				return 0, err
			}
			return at.Time.Sub(fo.promotedAt), err
		}
		var err1, err2 error
		res.FirstEffectAfterPromote, err1 = first(n.Effects)
		res.FirstReceiptAfter, err2 = first(n.Receipts)
		return errors.Join(err1, err2)
	}
	ph, err := e.phase(ctx, Transactional, config.Orders, config.Duration, fo)
	stopProbe()
	probeWG.Wait()
	if ph != nil {
		res.Phase = *ph
	}
	if err != nil {
		return res, err
	}
	if fo.killedAt.IsZero() || fo.promotedAt.IsZero() {
		return res, errors.New("the failover did not happen")
	}
	res.LagBytes, res.PromoteTook, res.StallFor = fo.lagBytes, fo.promoteTook, fo.stallTo.Sub(fo.stallFrom)
	onNewProbe, err := seqSet(ctx, admin, probeTable)
	if err != nil {
		return res, err
	}
	pb.measure(res, fo, onNewProbe)
	_, _ = admin.ExecContext(ctx, `DROP TABLE IF EXISTS `+probeTable)

	// The old primary, started on its own after the clients are gone
	// (with them running, a multi-host DSN would find two primaries),
	// shows what it had committed that the new one lacks.
	say("starting the old primary alone to read what it had committed")
	if err := pr.a.ctl(ctx, "start"); err != nil {
		return res, err
	}
	// Its synchronous_standby_names has no standby left: commit locally.
	old, err := openDB(pr.a.DSN("chaos-admin")+"&synchronous_commit=local", 2)
	if err != nil {
		return res, err
	}
	defer old.Close()
	if err := waitReady(ctx, old, "the old primary"); err != nil {
		return res, err
	}
	n := namesFor(run, Transactional)
	onOld, err := orderSet(ctx, old, n.Effects)
	if err != nil {
		return res, err
	}
	for id := range onOld {
		if !onNew[n.Effects][id] {
			res.EffectsOnOldPrimary++
		}
	}
	for _, t := range []string{n.Inbox, n.Outbox, outbox.DeadLetterTableName(n.Outbox), n.Effects, n.Receipts, probeTable} {
		_, _ = old.ExecContext(ctx, `DROP TABLE IF EXISTS `+t)
	}
	say("lost %d effects (%d of them on the old primary), %d receipts; doubled %d effects, %d receipts",
		res.Phase.Effects.Lost, res.EffectsOnOldPrimary, res.Phase.Receipts.Lost, res.Phase.Effects.Doubled, res.Phase.Receipts.Doubled)
	return res, pr.a.ctl(ctx, "stop", "-m", "immediate")
}

// orderSet reads the distinct order ids of a ledger table.
func orderSet(ctx context.Context, db *sql.DB, table string) (map[string]bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT DISTINCT order_id FROM `+table)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", table, err)
	}
	defer rows.Close()
	set := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		set[id] = true
	}
	return set, rows.Err()
}

func seqSet(ctx context.Context, db *sql.DB, table string) (map[int64]bool, error) {
	rows, err := db.QueryContext(ctx, `SELECT seq FROM `+table)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", table, err)
	}
	defer rows.Close()
	set := map[int64]bool{}
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, err
		}
		set[seq] = true
	}
	return set, rows.Err()
}

// failover is the failover run's fault schedule: one stall of the
// replica, then the lagging replica, the kill and the promotion.
type failover struct {
	pair   pair
	mode   string
	config FailoverConfig
	say    func(string, ...any)

	stallFrom, stallTo, killedAt, promotedAt time.Time
	promoteTook                              time.Duration
	lagBytes                                 int64
}

func (f *failover) String() string {
	return fmt.Sprintf("%s replication: the %s stopped %s at 30%%; at 60%% stopped %s, the primary killed and the replica promoted %s later",
		f.mode, f.config.LagProcess, f.config.Stall, f.config.Lag, f.config.PromoteAfter)
}

// ready: the phase drains once the schedule returned (see phase).
func (f *failover) ready(context.Context, names) (bool, string, error) {
	return false, "the failover has not happened yet", nil
}

func (f *failover) run(ctx context.Context, t targets) error {
	start := time.Now()
	primary, err := openDB(f.pair.a.DSN("chaos-admin"), 2)
	if err != nil {
		return err
	}
	defer primary.Close()
	replica, err := openDB(f.pair.b.DSN("chaos-admin"), 2)
	if err != nil {
		return err
	}
	defer replica.Close()
	lagger := func() (int, error) {
		if f.config.LagProcess == LagWALSender {
			var pid int
			err := primary.QueryRowContext(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&pid)
			return pid, err
		}
		return walReceiver(ctx, replica)
	}
	stop := func(d time.Duration) (pid int, from time.Time, err error) {
		if pid, err = lagger(); err != nil {
			return 0, time.Time{}, err
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return 0, time.Time{}, err
		}
		from = time.Now()
		return pid, from, sleep(ctx, d)
	}

	if err := sleep(ctx, time.Until(start.Add(f.config.Duration*3/10))); err != nil {
		return nil
	}
	pid, from, err := stop(f.config.Stall)
	if pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	if err != nil {
		return ignoreCanceled(err)
	}
	f.stallFrom, f.stallTo = from, time.Now()
	t.faults.add(faultReplicaStall, 1)
	f.say("%s (pid %d) stopped for %s", f.config.LagProcess, pid, f.config.Stall)

	if err := sleep(ctx, time.Until(start.Add(f.config.Duration*6/10))); err != nil {
		return nil
	}
	pid, _, err = stop(f.config.Lag)
	if err != nil {
		if pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		return ignoreCanceled(err)
	}
	// Read without committing: under synchronous replication a commit
	// would wait for the stopped replica.
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_ = primary.QueryRowContext(lctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), flush_lsn)::bigint FROM pg_stat_replication`).Scan(&f.lagBytes)
	cancel()
	if err := f.pair.a.crash(); err != nil {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		return err
	}
	f.killedAt = time.Now()
	t.faults.add(faultPrimaryCrash, 1)
	// The WAL receiver reads what reached its socket, then finds the
	// primary gone. (A stopped WAL sender died with the primary.)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	f.say("primary killed, the replica %d bytes behind", f.lagBytes)
	_ = sleep(ctx, f.config.PromoteAfter)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	before := time.Now()
	if err := f.pair.promote(pctx); err != nil {
		return err
	}
	f.promotedAt = time.Now()
	f.promoteTook = f.promotedAt.Sub(before)
	t.faults.add(faultPromote, 1)
	f.say("replica promoted in %s", f.promoteTook.Round(time.Millisecond))
	return nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// probe commits one-row inserts in a loop on the multi-host DSN and
// remembers when each started and whether it was acknowledged.
type probe struct {
	db    *sql.DB
	table string

	mu      sync.Mutex
	commits []probeCommit
}

type probeCommit struct {
	seq        int64
	start, end time.Time
	ok         bool
}

func (p *probe) run(ctx context.Context) {
	for seq := int64(1); ctx.Err() == nil; seq++ {
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := p.db.ExecContext(cctx, `INSERT INTO `+p.table+` (seq) VALUES ($1)`, seq)
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		p.commits = append(p.commits, probeCommit{seq: seq, start: start, end: time.Now(), ok: err == nil})
		p.mu.Unlock()
		pause := 10 * time.Millisecond
		if err != nil {
			pause = 50 * time.Millisecond
		}
		if sleep(ctx, pause) != nil {
			return
		}
	}
}

// measure fills res's probe figures.
func (p *probe) measure(res *FailoverResult, f *failover, onNew map[int64]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var lastBefore, firstAfter time.Time
	for _, c := range p.commits {
		if !c.ok {
			continue
		}
		res.ProbeAcked++
		if !onNew[c.seq] {
			res.ProbeLost++
		}
		if c.start.Before(f.stallTo) && c.end.After(f.stallFrom) {
			res.Stall = max(res.Stall, c.end.Sub(c.start))
			if c.end.Before(f.stallTo) {
				res.StallCommits++
			}
		}
		if !c.end.After(f.killedAt) {
			lastBefore = c.end
		} else if firstAfter.IsZero() {
			firstAfter = c.end
		}
	}
	if !firstAfter.IsZero() && !lastBefore.IsZero() {
		res.Outage = firstAfter.Sub(lastBefore)
		res.FirstCommitAfterKill = firstAfter.Sub(f.killedAt)
	}
}

// Print writes the failover table and the service table.
func (r *FailoverReport) Print(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\nfailover run %s, %s, %s in all; %d orders over %s (%d%% duplicates, %d workers); %s stopped %s (stall), then %s before the SIGKILL; promotion %s after it\n\n",
		r.Run, r.Started.Format("2006-01-02 15:04 UTC"), r.Elapsed.Round(time.Second), c.Orders, c.Duration, int(c.Duplicates*100),
		c.Workers, c.LagProcess, c.Stall, c.Lag, c.PromoteAfter)
	if len(r.Modes) > 0 {
		fmt.Fprintf(w, "| replication | messages | effects lost (on the old primary) | receipts lost | doubled (effects/receipts) | probe commits lost / acknowledged | lag at the kill | stall: longest commit while the replica was stopped %s (commits then) | longest gap between commits | promote took | first commit after the kill | first effect / receipt after promotion | verdict |\n", c.Stall)
		fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, m := range r.Modes {
			p := m.Phase
			rl, rd := -1, -1
			if p.Receipts != nil {
				rl, rd = p.Receipts.Lost, p.Receipts.Doubled
			}
			verdict := "OK"
			if !m.OK() {
				verdict = "FAILED"
			}
			fmt.Fprintf(w, "| %s | %d | %d (%d) | %d | %d / %d | %d / %d | %d B | %s (%d) | %s | %s | %s | %s / %s | %s |\n",
				m.Replication, p.Messages, p.Effects.Lost, m.EffectsOnOldPrimary, rl, p.Effects.Doubled, rd, m.ProbeLost, m.ProbeAcked,
				m.LagBytes, ms(m.Stall), m.StallCommits, ms(m.Outage), ms(m.PromoteTook),
				ms(m.FirstCommitAfterKill), ms(m.FirstEffectAfterPromote), ms(m.FirstReceiptAfter), verdict)
		}
		for _, m := range r.Modes {
			for _, l := range m.Phase.Notes {
				fmt.Fprintf(w, "%s: %s\n", m.Replication, l)
			}
			if len(m.Phase.Effects.LostOrders) > 0 {
				fmt.Fprintf(w, "%s: lost (sample): %v\n", m.Replication, slices.Clip(m.Phase.Effects.LostOrders))
			}
		}
	}
	printServices(w, c.PromoteAfter, r.Services)
	fmt.Fprintln(w)
}

func ms(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	if d >= 10*time.Second {
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
