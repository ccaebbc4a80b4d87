package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// Surface labels of RunSurfaces' phases.
const (
	surfaceOnceTx      = "once.Transactional"
	surfaceOnceTP      = "once.TwoPhase"
	surfaceHTTP        = "httpidem"
	surfacePartitioned = "partitioned inbox (t and public.t)"
)

// DefaultSurfacesPort and DefaultSurfacesCluster name RunSurfaces'
// private cluster: not the chaos suite's (DefaultPort), so both can run
// at once.
const (
	DefaultSurfacesPort    = 5450
	DefaultSurfacesCluster = "surfaces"
)

// SurfacesConfig is one run of RunSurfaces. Config holds the cluster,
// the workers and the partitioned-inbox phase (Orders, Duration,
// FaultEvery, Duplicates; Orders 0 skips it); the keyed scenarios have
// their own fields.
type SurfacesConfig struct {
	Config
	// Keys is how many keys each keyed scenario (once.Transactional,
	// once.TwoPhase under Reclaim and under Intervene, httpidem) calls;
	// 0 skips them. Every one of Workers callers calls every key, at
	// once, so each key is raced by Workers calls.
	Keys int
	// Callers is each caller's goroutines. Default: 8.
	Callers int
	// Spread is how long the keys take to fall due, so the faults fall
	// mid-stream; KeyFaultEvery is the mean pause between two faults.
	Spread, KeyFaultEvery time.Duration
	// Late is the fraction of keys each caller calls again LateAfter
	// after the first call (a retry after the answer).
	Late      float64
	LateAfter time.Duration
	// HTTPPolicy is the httpidem scenario's expired-lease policy.
	// Default: idempotency.Intervene.
	HTTPPolicy idempotency.ExpiredLeasePolicy
}

// SurfacesCI is the configuration of -config surfaces: a few hundred
// keys per scenario and every fault kind at least once, in about two
// minutes on two cores.
func SurfacesCI() SurfacesConfig {
	return SurfacesConfig{
		Config: Config{
			Orders: 200, Duration: 12 * time.Second, FaultEvery: 1500 * time.Millisecond,
			ExitAfterCommit: 0.02, Duplicates: 0.2, Timeout: 3 * time.Minute, EffectDelay: 100 * time.Millisecond,
			PGCluster: DefaultSurfacesCluster, PGPort: DefaultSurfacesPort,
		},
		Keys: 200, Spread: 15 * time.Second, KeyFaultEvery: 1200 * time.Millisecond,
		Late: 0.2, LateAfter: 3 * time.Second,
	}
}

// SurfacesFull is the configuration of -config surfaces-full.
func SurfacesFull() SurfacesConfig {
	c := SurfacesCI()
	c.Orders, c.Duration, c.Timeout = 2000, 90*time.Second, 10*time.Minute
	c.Keys, c.Spread, c.KeyFaultEvery = 2000, 90*time.Second, time.Second
	return c
}

func (c *SurfacesConfig) setDefaults() {
	if c.PGCluster == "" {
		c.PGCluster = DefaultSurfacesCluster
	}
	if c.PGPort == 0 {
		c.PGPort = DefaultSurfacesPort
	}
	if c.Callers == 0 {
		c.Callers = 8
	}
	c.Config.setDefaults()
}

// Validate reports every problem with the configuration at once.
func (c SurfacesConfig) Validate() error {
	base := c.Config
	if base.Orders == 0 { // the partitioned phase skipped: its fields do not matter
		base.Orders, base.FaultEvery = 1, time.Second
	}
	errs := []error{base.Validate()}
	if c.Keys < 0 || c.Orders < 0 || c.Keys == 0 && c.Orders == 0 {
		errs = append(errs, errors.New("chaos: Keys and Orders must not be negative, and not both 0"))
	}
	if c.Keys > 0 && (c.Spread <= 0 || c.KeyFaultEvery <= 0 || c.Callers < 1) {
		errs = append(errs, errors.New("chaos: Spread, KeyFaultEvery and Callers must be positive"))
	}
	if c.Late < 0 || c.Late > 1 {
		errs = append(errs, errors.New("chaos: Late is a fraction in [0, 1]"))
	}
	if c.HTTPPolicy != idempotency.Intervene && c.HTTPPolicy != idempotency.Reclaim {
		errs = append(errs, fmt.Errorf("chaos: unknown HTTP policy %s", c.HTTPPolicy))
	}
	return errors.Join(errs...)
}

// RunSurfaces runs the fault suite against the surfaces beside the
// router inbox: once.Transactional, once.TwoPhase (under Reclaim and
// under Intervene) and httpidem, all four at once under one fault deck,
// then the transactional phase of Run on the partitioned inbox, its
// table spelled "t" by half the workers and "public.t" by the others,
// with a janitor dropping expired partitions under the faults. See
// docs/reliability.md.
func RunSurfaces(ctx context.Context, config SurfacesConfig) (*Report, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if config.Orders > 0 {
		if err := checkAMQP(config.AMQPURL); err != nil {
			return nil, err
		}
	}
	cl, admin, done, err := openPrivate(ctx, config.Config)
	if err != nil {
		return nil, err
	}
	defer done()
	run, err := newRun("s", &config.LogDir)
	if err != nil {
		return nil, err
	}
	ledgerPath := filepath.Join(config.LogDir, "surfaces-ledger.db")
	ledger, err := sqlite.Open(ledgerPath)
	if err != nil {
		return nil, err
	}
	defer ledger.Close()
	report := &Report{Run: run, Started: time.Now().UTC(), Workers: config.Workers, Cluster: cl.String(), LogDir: config.LogDir, Surfaces: true}
	fmt.Fprintf(config.Out, "chaos: surfaces run %s, %d processes per scenario, child logs in %s\n", run, config.Workers, config.LogDir)
	e := &env{config: config.Config, exe: exe, run: run, cluster: cl, admin: admin, ledger: ledger, ledgerPath: ledgerPath}
	defer func() { report.Elapsed = time.Since(report.Started) }()
	if config.Keys > 0 {
		phases, err := e.keyed(ctx, config)
		report.Phases = append(report.Phases, phases...)
		if err != nil {
			return report, err
		}
	}
	if config.Orders > 0 {
		e.partitioned = true
		phase, err := e.phase(ctx, Transactional, config.Orders, config.Duration,
			&deck{e: e, mode: Transactional, orders: config.Orders, every: config.FaultEvery, dealt: make(chan struct{})})
		if phase != nil {
			report.Phases = append(report.Phases, *phase)
		}
		if err != nil {
			return report, err
		}
	}
	return report, nil
}

// scenario is one keyed scenario of a run.
type scenario struct {
	surface, api, mode string
	short              string // in table and process names
	policy             idempotency.ExpiredLeasePolicy
	n                  names
	outcomes           string // SQLite table of the answers
}

func (sc scenario) phase() Phase {
	ph := Phase{Surface: sc.surface, Mode: sc.mode}
	if sc.mode == TwoPhase {
		ph.Policy = sc.policy.String()
	}
	return ph
}

func (e *env) scenarios(httpPolicy idempotency.ExpiredLeasePolicy) []scenario {
	var out []scenario
	for _, sc := range []scenario{
		{surface: surfaceOnceTx, api: apiOnceTx, mode: Transactional},
		{surface: surfaceOnceTP, api: apiOnceTwoPhase, mode: TwoPhase, policy: idempotency.Reclaim},
		{surface: surfaceOnceTP, api: apiOnceTwoPhase, mode: TwoPhase, policy: idempotency.Intervene},
		{surface: surfaceHTTP, api: apiHTTP, mode: TwoPhase, policy: httpPolicy},
	} {
		short := map[string]string{apiOnceTx: "otx", apiOnceTwoPhase: "otp", apiHTTP: "htp"}[sc.api]
		if sc.mode == TwoPhase {
			short += sc.policy.String()[:1]
		}
		t := "chaos_" + e.run + "_" + short + "_"
		sc.short = short
		sc.n = names{Inbox: t + "inbox", Outbox: t + "outbox", Effects: t + "effects", Receipts: t + "receipts"}
		sc.outcomes = t + "outcomes"
		out = append(out, sc)
	}
	return out
}

// keyed runs the four keyed scenarios at once under one fault deck:
// callers (once) and servers (httpidem, with the clients here) SIGKILLed
// and restarted, their connections terminated, the cluster restarted.
// The faults go on until every call was answered and every kind was
// injected; then each scenario's ledger is tallied.
func (e *env) keyed(parent context.Context, config SurfacesConfig) (_ []Phase, err error) {
	ctx, cancel := context.WithTimeout(parent, e.config.Timeout)
	defer cancel()
	start := time.Now()
	scs := e.scenarios(config.HTTPPolicy)
	e.say("keyed scenarios: %d keys each, %d callers of %d goroutines, over %s, a fault every ~%s",
		config.Keys, config.Workers, config.Callers, config.Spread, config.KeyFaultEvery)
	for _, sc := range scs {
		if err := e.setupKeyed(ctx, sc); err != nil {
			return nil, err
		}
		if !e.config.Keep {
			defer e.cleanupKeyed(context.WithoutCancel(ctx), sc)
		}
	}
	faults := newFaultCounter()
	sup := &supervisor{exe: e.exe, logDir: e.config.LogDir, faults: faults, mode: "surfaces"}
	defer sup.stopAll(5 * time.Second)
	sp := surfaceSpec{Keys: config.Keys, Callers: config.Callers, Start: time.Now().Add(2 * time.Second),
		Spread: config.Spread, Late: config.Late, LateAfter: config.LateAfter}
	var targets, callers []*proc
	var clients sync.WaitGroup
	answers := make([][]answer, len(scs))
	var answersMu sync.Mutex
	clientCtx, stopClients := context.WithCancel(ctx)
	defer func() { stopClients(); clients.Wait() }()
	for i, sc := range scs {
		base := spec{Mode: sc.mode, Names: sc.n, LedgerPath: e.ledgerPath, Lease: e.config.Lease,
			Policy: sc.policy, EffectDelay: e.config.EffectDelay}
		var addrs []string
		for w := range e.config.Workers {
			s, ssp := base, sp
			ssp.API, ssp.Outcomes = sc.api, sc.outcomes
			s.Surface = &ssp
			if sc.api == apiHTTP {
				if ssp.Addr, err = freeAddr(); err != nil {
					return nil, err
				}
				addrs = append(addrs, ssp.Addr)
				s.Role, s.Name = roleServer, fmt.Sprintf("%s-server-%d", sc.short, w+1)
			} else {
				ssp.Finite = true
				s.Role, s.Name = roleCaller, fmt.Sprintf("%s-caller-%d", sc.short, w+1)
			}
			s.DSN = e.dsn("chaos-" + s.Name)
			p, err := sup.start(s)
			if err != nil {
				return nil, err
			}
			targets = append(targets, p)
			if ssp.Finite {
				callers = append(callers, p)
			}
		}
		if sc.api == apiHTTP {
			for w := range e.config.Workers {
				clients.Add(1)
				go func() {
					defer clients.Done()
					got := e.httpClient(clientCtx, sp, fmt.Sprintf("client-%d", w+1), addrs)
					answersMu.Lock()
					answers[i] = append(answers[i], got...)
					answersMu.Unlock()
				}()
			}
		}
	}
	clientsDone := make(chan struct{})
	go func() { clients.Wait(); close(clientsDone) }()

	dealt := make(chan struct{})
	in := &injector{cluster: e.cluster, admin: e.admin, workers: targets, faults: faults, every: config.KeyFaultEvery,
		kinds:    []string{faultWorkerKill, faultWorkerKill, faultWorkerKill, faultTerminate, faultTerminate, faultRestartFast, faultRestartCrash},
		progress: e.progress(), dealt: dealt}
	faultCtx, stopFaults := context.WithCancel(ctx)
	faultErr := make(chan error, 1)
	go func() { faultErr <- in.run(faultCtx) }()
	// Bounded: a caller or client group that can never finish (a server
	// that cannot start, a key that never settles) fails the run instead
	// of holding CI.
	waitCtx, stopWait := context.WithTimeout(ctx, keyedWaitLimit)
	defer stopWait()
	waitErr := e.waitFor(waitCtx, "every call answered and every fault kind injected", func(context.Context) (bool, string, error) {
		left := 0
		for _, p := range callers {
			select {
			case <-p.exited:
			default:
				left++
			}
		}
		select {
		case <-clientsDone:
		default:
			left++
		}
		select {
		case <-dealt:
			return left == 0, fmt.Sprintf("%d callers and client groups at work", left), nil
		default:
			return false, "not every fault kind injected yet", nil
		}
	})
	stopFaults()
	if err := errors.Join(waitErr, <-faultErr); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, e.admin, "the private cluster"); err != nil {
		return nil, err
	}
	sup.stopAll(10 * time.Second)
	counts, backends, notes := faults.snapshot()
	var phases []Phase
	for i, sc := range scs {
		ph := sc.phase()
		ph.SharedFaults = i > 0
		ph.Faults, ph.Backends, ph.Notes, ph.Orders = counts, backends, append([]string(nil), notes...), config.Keys
		got := answers[i]
		if sc.api != apiHTTP {
			if got, err = e.readAnswers(ctx, sc); err != nil {
				return phases, err
			}
		}
		effects, err := e.readEffects(ctx, sc)
		if err != nil {
			return phases, err
		}
		unresolved, err := e.inProgress(ctx, sc)
		if err != nil {
			return phases, err
		}
		tallyKeyed(config.Keys, effects, got, unresolved, &ph)
		ph.Elapsed = time.Since(start)
		phases = append(phases, ph)
	}
	e.say("keyed scenarios done in %s", time.Since(start).Round(time.Second))
	return phases, nil
}

// freeAddr is a loopback address with a port free right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// httpClient makes the calls of caller's plan against the servers, each
// attempt to a random one, and returns the answers.
func (e *env) httpClient(ctx context.Context, sp surfaceSpec, caller string, addrs []string) []answer {
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	var out []answer
	_ = runCalls(ctx, sp.plan(caller), e.config.Workers*4, httpAttempt(client, func() string { return addrs[rand.N(len(addrs))] }),
		func(c call, a answer) error {
			a.Caller, a.Pass = caller, c.Pass
			mu.Lock()
			out = append(out, a)
			mu.Unlock()
			return nil
		})
	return out
}

// The keyed scenarios' ledgers are append-only, like Run's: a doubled
// effect is a second row. The effect of once.Transactional is written in
// its transaction, on the private cluster; the others' go to the SQLite
// ledger, as the answers do.
func (e *env) setupKeyed(ctx context.Context, sc scenario) error {
	if err := sc.n.validate(); err != nil {
		return err
	}
	repo, err := inboxRepository(e.admin, spec{Names: sc.n})
	if err != nil {
		return err
	}
	if err := repo.Migrate(ctx); err != nil {
		return fmt.Errorf("chaos: inbox schema: %w", err)
	}
	stmts := []struct {
		db  *sql.DB
		ddl string
	}{{e.ledger, `CREATE TABLE IF NOT EXISTS ` + sc.outcomes + ` (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL,
		caller TEXT NOT NULL, pass INTEGER NOT NULL, outcome TEXT NOT NULL, value TEXT NOT NULL, attempts INTEGER NOT NULL)`}}
	if sc.api == apiOnceTx {
		stmts = append(stmts, struct {
			db  *sql.DB
			ddl string
		}{e.admin, `CREATE TABLE IF NOT EXISTS ` + sc.n.Effects + ` (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			order_id TEXT NOT NULL, token TEXT NOT NULL, process TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())`})
	} else {
		stmts = append(stmts, struct {
			db  *sql.DB
			ddl string
		}{e.ledger, `CREATE TABLE IF NOT EXISTS ` + sc.n.Effects + ` (id INTEGER PRIMARY KEY AUTOINCREMENT,
			order_id TEXT NOT NULL, token TEXT NOT NULL, process TEXT NOT NULL, at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)`})
	}
	for _, s := range stmts {
		if _, err := s.db.ExecContext(ctx, s.ddl); err != nil {
			return fmt.Errorf("chaos: ledger table: %w", err)
		}
	}
	return nil
}

func (e *env) cleanupKeyed(ctx context.Context, sc scenario) {
	e.cleanup(ctx, sc.mode, sc.n, nil)
	if _, err := e.ledger.ExecContext(ctx, `DROP TABLE IF EXISTS `+sc.outcomes); err != nil {
		e.say("cleanup of %s: %v", sc.surface, err)
	}
}

func (e *env) readAnswers(ctx context.Context, sc scenario) ([]answer, error) {
	rows, err := e.ledger.QueryContext(ctx, `SELECT key, caller, pass, outcome, value, attempts FROM `+sc.outcomes)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading answers: %w", err)
	}
	defer rows.Close()
	var out []answer
	for rows.Next() {
		var a answer
		if err := rows.Scan(&a.Key, &a.Caller, &a.Pass, &a.Outcome, &a.Value, &a.Attempts); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// readEffects returns the tokens of the effects applied, per key.
func (e *env) readEffects(ctx context.Context, sc scenario) (map[string][]string, error) {
	db := e.ledger
	if sc.api == apiOnceTx {
		db = e.admin
	}
	rows, err := db.QueryContext(ctx, `SELECT order_id, token FROM `+sc.n.Effects)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading ledger %s: %w", sc.n.Effects, err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var key, token string
		if err := rows.Scan(&key, &token); err != nil {
			return nil, err
		}
		out[key] = append(out[key], token)
	}
	return out, rows.Err()
}

// inProgress returns the keys whose record is left in progress: the
// intervention records. httpidem stores a key after its principal and
// route, so the key is the stored key's tail.
func (e *env) inProgress(ctx context.Context, sc scenario) (map[string]bool, error) {
	rows, err := e.admin.QueryContext(ctx, `SELECT dedup_key FROM `+sc.n.Inbox+` WHERE state = 'in_progress'`)
	if err != nil {
		return nil, fmt.Errorf("chaos: reading records: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			return nil, err
		}
		if i := strings.LastIndex(key, "k-"); i >= 0 {
			key = key[i:]
		}
		out[key] = true
	}
	return out, rows.Err()
}

// tallyKeyed reads a keyed scenario's ledger into ph: effects per key
// (doubled, applied), answers that are not an applied effect's (Wrong),
// keys in progress (Intervention, of which InterventionApplied had their
// effect) and keys lost (UnexplainedLost): under Intervene, a key no
// call got a success for and with no record in progress for an operator;
// otherwise, a key without effect or without a success.
func tallyKeyed(keys int, effects map[string][]string, answers []answer, inProgress map[string]bool, ph *Phase) {
	ids := make(map[string]bool, keys)
	for i := range keys {
		ids[keyName(i)] = true
	}
	counts := make(map[string]int, len(effects))
	tokens := map[string]bool{}
	for key, ts := range effects {
		counts[key] = len(ts)
		for _, t := range ts {
			tokens[key+"\x00"+t] = true
		}
	}
	ph.Effects = tallyOrders(ids, counts)
	answered := map[string]bool{}
	ph.Messages = len(answers)
	for _, a := range answers {
		switch a.Outcome {
		case outcomeOK, outcomeReplayed:
			answered[a.Key] = true
			if !tokens[a.Key+"\x00"+a.Value] {
				ph.Wrong++
				ph.Notes = append(ph.Notes, fmt.Sprintf("%s answered %s %q, which is no effect of the key", a.Key, a.Outcome, a.Value))
			}
		case outcomeFailed:
			ph.Wrong++
			ph.Notes = append(ph.Notes, fmt.Sprintf("%s failed: %s", a.Key, a.Value))
		case outcomeGaveUp:
			ph.Notes = append(ph.Notes, fmt.Sprintf("%s: a caller gave up after %d attempts: %s", a.Key, a.Attempts, a.Value))
		}
	}
	intervene := ph.Mode == TwoPhase && ph.Policy == idempotency.Intervene.String()
	for key := range ids {
		if inProgress[key] {
			ph.Intervention++
			if counts[key] > 0 {
				ph.InterventionApplied++
			}
		}
		switch {
		case intervene && !answered[key] && !inProgress[key],
			!intervene && (!answered[key] || counts[key] == 0):
			ph.UnexplainedLost++
		}
	}
	if len(ph.Notes) > 20 {
		ph.Notes = append(ph.Notes[:20], fmt.Sprintf("… and %d more", len(ph.Notes)-20))
	}
}

// printSurfaces writes the ledger table of a RunSurfaces report.
func printSurfaces(w io.Writer, phases []Phase) {
	fmt.Fprintf(w, "\n| surface | keys | calls (duplicates) | faults | doubled | lost | wrong answers | intervention records (effect applied) | time | verdict |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, p := range phases {
		faults := 0
		for _, c := range p.Faults {
			faults += c
		}
		lost, iv := p.UnexplainedLost, "–"
		if p.Receipts != nil { // the partitioned inbox's phase: Run's ledger
			lost = p.Effects.Lost + p.Receipts.Lost
		}
		if p.Mode == TwoPhase {
			iv = fmt.Sprintf("%d (%d)", p.Intervention, p.InterventionApplied)
		}
		doubled := p.Effects.Doubled
		if p.Receipts != nil {
			doubled += p.Receipts.Doubled
		}
		verdict := "OK"
		if !p.OK() {
			verdict = "FAILED"
		}
		fmt.Fprintf(w, "| %s | %d | %d (%d) | %d | %d | %d | %d | %s | %s | %s |\n", p.label(), p.Orders, p.Messages, p.Messages-p.Orders,
			faults, doubled, lost, p.Wrong, iv, p.Elapsed.Round(time.Second), verdict)
	}
	for _, p := range phases {
		if j := p.Janitor; j != nil {
			fmt.Fprintf(w, "%s: janitor: %d expired partitions (%d records) seeded, %d DeleteExpired calls under the faults (%d failed), %d records reported deleted, %d seeded records left\n",
				p.label(), j.Partitions, j.Records, j.Runs, j.Errors, j.Deleted, j.Left)
		}
		if p.Mode == TwoPhase && p.Policy == idempotency.Reclaim.String() && p.Effects.Doubled > 0 {
			fmt.Fprintf(w, "%s: %d doubled effects are Reclaim's documented price (an attempt SIGKILLed after its effect, re-run after its lease)\n", p.label(), p.Effects.Doubled)
		}
		for _, n := range p.Notes {
			fmt.Fprintf(w, "%s: %s\n", p.label(), n)
		}
	}
	fmt.Fprintln(w)
}

// keyedWaitLimit bounds the keyed scenarios' wait for every call to be
// answered: several times the full configuration's run.
const keyedWaitLimit = 10 * time.Minute
