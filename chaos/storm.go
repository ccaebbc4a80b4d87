package chaos

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// Drivers RunStorm measures.
const (
	StormDatabaseSQL = "database/sql" // pgx's stdlib driver through sql.Open
	StormPgxpool     = "pgxpool"
)

// DefaultStormPort and DefaultStormCluster name RunStorm's private
// cluster: neither Run's nor RunSurfaces', so the three can run at once.
const (
	DefaultStormPort    = 5455
	DefaultStormCluster = "storm"
)

// stormSettings are the storm cluster's: PostgreSQL's default
// max_connections (100), so its listening socket's backlog is what a
// default server has (2·(max_connections + background processes) = 244).
const stormSettings = `# Written by the watermill-idempotent chaos suite (chaos, storm).
listen_addresses = '127.0.0.1'
max_connections = 100
shared_buffers = 32MB
`

// stormBucket is the resolution at which successful calls are counted;
// stormWindow is the span over which throughput counts as back.
const (
	stormBucket = 100 * time.Millisecond
	stormWindow = 500 * time.Millisecond
)

// StormConfig is one run of RunStorm: for each driver and StoreTimeout,
// Pools pools of Workers workers calling once.TwoPhase, a baseline, every
// client backend terminated, and the time until the throughput is back.
type StormConfig struct {
	// Pools is how many connection pools (services) call at once, each
	// capped at Workers connections. Default: 6.
	Pools int
	// Workers is each pool's goroutines, each calling once.TwoPhase.Do
	// for a new key as soon as its last call returned (10 ms later after
	// an error). Default: 12.
	Workers int
	// Drivers are StormDatabaseSQL and StormPgxpool. Default: both.
	Drivers []string
	// StoreTimeouts are the once.TwoPhaseConfig.StoreTimeout values measured, each
	// with a Lease three times as long (the default ratio). Default:
	// 100 ms, 1 s, 5 s.
	StoreTimeouts []time.Duration
	// Warmup is how long the pools run after their first call got
	// through (which may take up to 30 s on a busy machine) before the
	// baseline window, and Baseline that window. Default: 3 s each.
	Warmup, Baseline time.Duration
	// Cap is how long after the fault the throughput may take to come
	// back to half the baseline; past it the cell reports never.
	// Default: 30 s.
	Cap time.Duration

	// PGVersion, PGCluster and PGPort name the private cluster. Default:
	// the newest PostgreSQL, DefaultStormCluster, DefaultStormPort.
	PGVersion, PGCluster string
	PGPort               int
	// Out receives progress and the table. Default: os.Stdout.
	Out io.Writer
}

func (c *StormConfig) setDefaults() {
	if c.Pools == 0 {
		c.Pools = 6
	}
	if c.Workers == 0 {
		c.Workers = 12
	}
	if len(c.Drivers) == 0 {
		c.Drivers = []string{StormDatabaseSQL, StormPgxpool}
	}
	if len(c.StoreTimeouts) == 0 {
		c.StoreTimeouts = []time.Duration{100 * time.Millisecond, time.Second, 5 * time.Second}
	}
	if c.Warmup == 0 {
		c.Warmup = 3 * time.Second
	}
	if c.Baseline == 0 {
		c.Baseline = 3 * time.Second
	}
	if c.Cap == 0 {
		c.Cap = 30 * time.Second
	}
	if c.PGCluster == "" {
		c.PGCluster = DefaultStormCluster
	}
	if c.PGPort == 0 {
		c.PGPort = DefaultStormPort
	}
	if c.PGVersion == "" {
		c.PGVersion = os.Getenv(VersionEnv)
		if c.PGVersion == "" {
			c.PGVersion = newestPostgres()
		}
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
}

// Validate reports every problem with the configuration at once.
func (c StormConfig) Validate() error {
	var errs []error
	if c.Pools < 1 || c.Workers < 1 || c.Pools*c.Workers > 90 {
		errs = append(errs, errors.New("chaos: storm: Pools and Workers must be positive, and Pools·Workers at most 90 (max_connections 100)"))
	}
	for _, d := range c.Drivers {
		if d != StormDatabaseSQL && d != StormPgxpool {
			errs = append(errs, fmt.Errorf("chaos: storm: unknown driver %q (%s or %s)", d, StormDatabaseSQL, StormPgxpool))
		}
	}
	for _, st := range c.StoreTimeouts {
		if st <= 0 {
			errs = append(errs, errors.New("chaos: storm: StoreTimeouts must be positive"))
		}
	}
	if c.Warmup < 0 || c.Baseline < stormWindow || c.Cap < stormWindow {
		errs = append(errs, fmt.Errorf("chaos: storm: Warmup must not be negative, Baseline and Cap at least %s", stormWindow))
	}
	if c.PGPort == sharedPort || c.PGCluster == "main" {
		errs = append(errs, fmt.Errorf("chaos: the private cluster must not be the shared one (main, port %d)", sharedPort))
	}
	if c.PGVersion == "" {
		errs = append(errs, fmt.Errorf("%w: no PostgreSQL server under /usr/lib/postgresql (set %s)", ErrPrerequisite, VersionEnv))
	}
	return errors.Join(errs...)
}

// StormCell is what one driver and StoreTimeout measured.
type StormCell struct {
	Driver       string
	StoreTimeout time.Duration
	// FirstCall is when the first call succeeded, from the start of the
	// cold pools; Warmed is false when none did, or when no Baseline
	// window in the 30 s after it served a call.
	FirstCall time.Duration
	Warmed    bool
	// Before is the successful calls per second in the baseline window.
	Before float64
	// Terminated is how many backends the fault terminated.
	Terminated int
	// Recovery is the time from the fault to the end of the first
	// stormWindow whose throughput was at least half of Before;
	// Recovered is false when that did not happen within Cap.
	Recovery  time.Duration
	Recovered bool
	// QueueMax is the most connections the cluster's listening socket
	// held in its accept queue after the fault (sampled every
	// stormBucket), of Backlog (0 when ss could not tell).
	QueueMax, Backlog int
	// Calls and Errors count the calls that succeeded and failed.
	Calls, Errors int64
}

// OK reports whether the cell warmed up and came back after the fault.
func (c StormCell) OK() bool { return c.Warmed && c.Recovered }

// StormReport is what RunStorm measured.
type StormReport struct {
	Cluster        string
	Pools, Workers int
	Started        time.Time
	Elapsed, Cap   time.Duration
	Warmup, Window time.Duration
	Cells          []StormCell
	MaxConnections int
}

// OK reports whether every cell warmed up and recovered.
func (r *StormReport) OK() bool {
	for _, c := range r.Cells {
		if !c.OK() {
			return false
		}
	}
	return len(r.Cells) > 0
}

// Print writes the table.
func (r *StormReport) Print(w io.Writer) {
	fmt.Fprintf(w, "\nreconnect storm, %s, private PostgreSQL %s (max_connections %d), %d pools × %d workers of once.TwoPhase, Lease 3 × StoreTimeout;\n",
		r.Started.Format("2006-01-02 15:04 UTC"), r.Cluster, r.MaxConnections, r.Pools, r.Workers)
	fmt.Fprintf(w, "baseline %s after the first call, then every client backend terminated; back = a %s window at half the baseline (cap %s); %s in all\n\n",
		r.Warmup, stormWindow, r.Cap, r.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "| driver | StoreTimeout | first call after start | calls/s before the fault | backends terminated | time to half the baseline | accept queue after the fault (max of backlog) | calls ok / failed |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range r.Cells {
		first, before, back, terminated := "never", "0", "– (no baseline)", "–"
		if c.Warmed {
			first = c.FirstCall.Round(10 * time.Millisecond).String()
			before = fmt.Sprintf("%.0f", c.Before)
			terminated = strconv.Itoa(c.Terminated)
			back = fmt.Sprintf("never (> %s)", r.Cap)
			if c.Recovered {
				back = c.Recovery.Round(10 * time.Millisecond).String()
			}
		}
		queue := "–"
		switch {
		case c.Warmed && c.Backlog > 0:
			queue = fmt.Sprintf("%d of %d", c.QueueMax, c.Backlog)
		case c.Warmed:
			queue = strconv.Itoa(c.QueueMax)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %d / %d |\n",
			c.Driver, c.StoreTimeout, first, before, terminated, back, queue, c.Calls, c.Errors)
	}
	fmt.Fprintln(w)
}

// RunStorm measures how a fleet of once.TwoPhase callers comes back
// after every connection to the database was terminated, per driver and
// StoreTimeout, on a private cluster (stopped at the end).
func RunStorm(ctx context.Context, config StormConfig) (*StormReport, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	cl := cluster{version: config.PGVersion, name: config.PGCluster, port: config.PGPort, settings: stormSettings}
	cl, admin, done, err := openCluster(ctx, cl, config.Out)
	if err != nil {
		return nil, err
	}
	defer done()
	// The admin terminates the others and must keep its own connection
	// through the storm: one, never idle-closed.
	admin.SetMaxOpenConns(1)
	admin.SetMaxIdleConns(1)
	var b [4]byte
	_, _ = rand.Read(b[:])
	run := "m" + hex.EncodeToString(b[:])
	s := &storm{config: config, cluster: cl, admin: admin, table: "chaos_" + run + "_storm"}
	repo, err := postgres.NewRepository(admin, postgres.Config{Table: s.table})
	if err != nil {
		return nil, err
	}
	if err := repo.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("chaos: storm: inbox schema: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = admin.ExecContext(dctx, `DROP TABLE IF EXISTS `+s.table)
	}()
	report := &StormReport{Cluster: cl.String(), Pools: config.Pools, Workers: config.Workers, Started: time.Now().UTC(),
		Cap: config.Cap, Warmup: config.Warmup, Window: stormWindow}
	if err := admin.QueryRowContext(ctx, `SELECT current_setting('max_connections')::int`).Scan(&report.MaxConnections); err != nil {
		return nil, err
	}
	fmt.Fprintf(config.Out, "chaos: storm run %s: %d pools × %d workers, StoreTimeouts %v, drivers %s\n",
		run, config.Pools, config.Workers, config.StoreTimeouts, strings.Join(config.Drivers, ", "))
	for _, driver := range config.Drivers {
		for _, st := range config.StoreTimeouts {
			cell, err := s.cell(ctx, driver, st)
			if err != nil {
				return report, err
			}
			report.Cells = append(report.Cells, cell)
			fmt.Fprintf(config.Out, "chaos: storm %s, StoreTimeout %s: warmed %t (first call %s), %.0f calls/s, back %t after %s, accept queue max %d of %d\n",
				driver, st, cell.Warmed, cell.FirstCall.Round(time.Millisecond), cell.Before, cell.Recovered,
				cell.Recovery.Round(time.Millisecond), cell.QueueMax, cell.Backlog)
			if err := s.settle(ctx); err != nil {
				return report, err
			}
		}
	}
	report.Elapsed = time.Since(report.Started)
	return report, nil
}

type storm struct {
	config  StormConfig
	cluster cluster
	admin   *sql.DB
	table   string
	cells   int
}

// stormApp prefixes the application_name of the storm's pools, so the
// fault terminates them and nothing else.
const stormApp = "chaos-storm-"

// cell measures one driver and StoreTimeout from cold pools.
func (s *storm) cell(parent context.Context, driver string, storeTimeout time.Duration) (cell StormCell, _ error) {
	s.cells++
	cell = StormCell{Driver: driver, StoreTimeout: storeTimeout}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	var callers []*once.TwoPhase
	for p := range s.config.Pools {
		dsn := s.cluster.DSN(fmt.Sprintf("%s%d", stormApp, p+1))
		var repo repository.TwoPhase // postgres.Repository on driver
		switch driver {
		case StormDatabaseSQL:
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				return cell, err
			}
			closers = append(closers, func() { _ = db.Close() })
			db.SetMaxOpenConns(s.config.Workers)
			db.SetMaxIdleConns(s.config.Workers)
			if repo, err = postgres.NewRepository(db, postgres.Config{Table: s.table}); err != nil {
				return cell, err
			}
		case StormPgxpool:
			pc, err := pgxpool.ParseConfig(dsn)
			if err != nil {
				return cell, err
			}
			pc.MaxConns = int32(s.config.Workers)
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			if err != nil {
				return cell, err
			}
			closers = append(closers, pool.Close)
			if repo, err = postgres.NewPgxRepository(pool, postgres.Config{Table: s.table}); err != nil {
				return cell, err
			}
		}
		o, err := once.NewTwoPhase(once.TwoPhaseConfig{Repository: repo, Scope: "storm", Lease: 3 * storeTimeout, StoreTimeout: storeTimeout})
		if err != nil {
			return cell, err
		}
		callers = append(callers, o)
	}

	total := 2*stormWarmupLimit + s.config.Warmup + s.config.Baseline + s.config.Cap + 2*stormWindow
	tp := newThroughput(total)
	var errs atomic.Int64
	var wg sync.WaitGroup
	for p, o := range callers {
		for w := range s.config.Workers {
			wg.Go(func() {
				for i := 0; ctx.Err() == nil; i++ {
					key := fmt.Sprintf("%d-%d-%d-%d", s.cells, p, w, i)
					_, err := o.Do(ctx, key, func(context.Context) ([]byte, error) { return []byte("ok"), nil })
					switch {
					case err == nil:
						tp.add()
					case ctx.Err() == nil:
						errs.Add(1)
						pauseFor(ctx, 10*time.Millisecond)
					}
				}
			})
		}
	}
	defer func() {
		cancel()
		wg.Wait()
		cell.Calls, cell.Errors = tp.total(), errs.Load()
	}()

	// Cold pools warm up in their own time on a busy machine: the
	// baseline starts Warmup after the first call got through, which
	// may take up to stormWarmupLimit.
	for {
		if cell.FirstCall, cell.Warmed = tp.first(); cell.Warmed || time.Since(tp.start) > stormWarmupLimit {
			break
		}
		if !sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) {
			return cell, ctx.Err()
		}
	}
	if !cell.Warmed {
		return cell, nil
	}
	// The baseline is the first Baseline window, Warmup after the first
	// call, in which calls got through: on a loaded machine the pools may
	// serve a few calls and then time out for a while before they settle.
	// Windows slide by stormBucket until one counts or stormWarmupLimit
	// has passed since the first call.
	for from := cell.FirstCall + s.config.Warmup; ; from += stormBucket {
		if !sleepUntil(ctx, tp.start.Add(from+s.config.Baseline)) {
			return cell, ctx.Err()
		}
		if cell.Before = tp.rate(from, from+s.config.Baseline); cell.Before > 0 {
			break
		}
		if from-cell.FirstCall > stormWarmupLimit {
			cell.Warmed = false
			return cell, nil
		}
	}
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	err := s.admin.QueryRowContext(fctx, `SELECT count(*) FILTER (WHERE t) FROM (SELECT pg_terminate_backend(pid) AS t
		FROM pg_stat_activity WHERE application_name LIKE $1 AND pid <> pg_backend_pid()) k`, stormApp+"%").Scan(&cell.Terminated)
	fcancel()
	if err != nil {
		return cell, fmt.Errorf("chaos: storm: terminating the backends: %w", err)
	}
	fault := time.Since(tp.start)
	cell.Backlog, _ = listenBacklog(ctx, s.cluster.port) // 0 without ss: the table shows the queue alone
	for at := fault; at < fault+s.config.Cap; at += stormBucket {
		if q, err := acceptQueue(s.cluster.port); err == nil {
			cell.QueueMax = max(cell.QueueMax, q)
		}
		if !sleepUntil(ctx, tp.start.Add(at+stormBucket)) {
			return cell, ctx.Err()
		}
		if back, ok := tp.backAt(fault, at+stormBucket, cell.Before/2); ok {
			cell.Recovery, cell.Recovered = back-fault, true
			break
		}
	}
	return cell, nil
}

// stormWarmupLimit bounds the wait for a cell's first call.
const stormWarmupLimit = 30 * time.Second

// settle waits, after a cell, until the cluster has no storm backend
// left and an empty accept queue, so that the next cell starts from
// the same state.
func (s *storm) settle(ctx context.Context) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var n int
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.admin.QueryRowContext(qctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1`, stormApp+"%").Scan(&n)
		cancel()
		q, qerr := acceptQueue(s.cluster.port)
		if err == nil && n == 0 && (qerr != nil || q == 0) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: storm: the cluster did not settle after a cell (%d storm backends, accept queue %d): %v", n, q, errors.Join(err, qerr))
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return ctx.Err()
		}
	}
}

// throughput counts successful calls in stormBucket buckets from start.
type throughput struct {
	start   time.Time
	buckets []atomic.Int64
	firstAt atomic.Int64 // nanoseconds after start of the first call, +1
}

func newThroughput(span time.Duration) *throughput {
	return &throughput{start: time.Now(), buckets: make([]atomic.Int64, span/stormBucket+1)}
}

func (t *throughput) add() {
	since := time.Since(t.start)
	t.firstAt.CompareAndSwap(0, int64(since)+1)
	if i := int(since / stormBucket); i < len(t.buckets) {
		t.buckets[i].Add(1)
	}
}

func (t *throughput) first() (time.Duration, bool) {
	n := t.firstAt.Load()
	return time.Duration(n - 1), n > 0
}

func (t *throughput) total() int64 {
	var n int64
	for i := range t.buckets {
		n += t.buckets[i].Load()
	}
	return n
}

// rate is the calls per second in the buckets from from to to.
func (t *throughput) rate(from, to time.Duration) float64 {
	var n int64
	for i := int(from / stormBucket); i < int(to/stormBucket) && i < len(t.buckets); i++ {
		n += t.buckets[i].Load()
	}
	return float64(n) / (to - from).Seconds()
}

// backAt reports the end of the first stormWindow that starts after
// fault and ends by until with a rate of at least half; windows are
// aligned on the buckets.
func (t *throughput) backAt(fault, until time.Duration, half float64) (time.Duration, bool) {
	first := (fault + stormBucket - 1) / stormBucket * stormBucket
	for end := first + stormWindow; end <= until; end += stormBucket {
		if t.rate(end-stormWindow, end) >= half {
			return end, true
		}
	}
	return 0, false
}

// acceptQueue reads how many connections wait in the accept queue of
// the listening socket on port (/proc/net/tcp: for a listening socket,
// st 0A, rx_queue is the accept queue).
func acceptQueue(port int) (int, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	suffix := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue …
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[3] != "0A" || !strings.HasSuffix(fields[1], suffix) {
			continue
		}
		if _, rx, ok := strings.Cut(fields[4], ":"); ok {
			q, err := strconv.ParseInt(rx, 16, 64)
			return int(q), err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no listening socket on port %d", port)
}

// listenBacklog asks ss for the backlog of the listening socket on port
// (its Send-Q), which /proc/net/tcp does not show.
func listenBacklog(ctx context.Context, port int) (int, error) {
	out, err := exec.CommandContext(ctx, "ss", "-Hltn", fmt.Sprintf("sport = :%d", port)).Output()
	if err != nil {
		return 0, fmt.Errorf("ss: %w", err)
	}
	// State Recv-Q Send-Q Local Peer
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return 0, fmt.Errorf("ss: no listening socket on port %d", port)
	}
	return strconv.Atoi(fields[2])
}

// sleepUntil waits until t, and reports false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func pauseFor(ctx context.Context, d time.Duration) { sleepUntil(ctx, time.Now().Add(d)) }
