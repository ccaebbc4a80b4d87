package janitor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/internal/fanout"
	"github.com/idemkit/watermill-idempotent/internal/settings"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Defaults applied by NewJanitor to zero Config fields.
const (
	DefaultInterval  = time.Minute
	DefaultBatchSize = 1000
	// DefaultPause leaves claims room between two batches. Measured with
	// the soak benchmark (docs/benchmarks.md) on a 2-core machine while a
	// 1,000,000-row backlog drained: 10 ms raised claim p99 by about 2×,
	// 30 ms by about 1.3×, at half the deletion speed (37 s instead of
	// 17 s for the backlog).
	DefaultPause = 30 * time.Millisecond
)

// routerPollInterval is how often a janitor started by RouterPlugin checks
// whether its router has closed: Watermill v1.5 gives plugins no signal
// for that, only Router.IsClosed.
const routerPollInterval = 200 * time.Millisecond

var (
	// ErrClosed is returned by Run, RunOnce and the router plugin once
	// Close has been called.
	ErrClosed = errors.New("janitor: closed")
	// ErrRunning is returned by Run and the router plugin while another
	// Run of the same Janitor is in progress.
	ErrRunning = errors.New("janitor: already running")
)

// Batch describes one DeleteExpired call. It is what Config.Observer
// receives, the hook for metrics.
type Batch struct {
	// Deleted is how many records the batch removed.
	Deleted int
	// Duration is how long the statement took.
	Duration time.Duration
	// Before is the pass's cutoff: records that expired before it are
	// deleted.
	Before time.Time
	// Err is the batch's error; nil on success.
	Err error
}

// Observer receives a report of every batch: the extension point for
// metrics (metrics.Metrics implements it), health checks
// (health.JanitorStatus) and tracing (tracing.Tracer). It is called from
// the goroutine running the pass and must not block. An Observer that
// also implements SampleObserver gets record samples too, and one that
// implements BatchStarter is told when each batch begins.
type Observer interface {
	ObserveJanitorBatch(ctx context.Context, b Batch)
}

// ObserverFunc is a function as an Observer (it takes no samples).
type ObserverFunc func(ctx context.Context, b Batch)

// ObserveJanitorBatch calls f.
func (f ObserverFunc) ObserveJanitorBatch(ctx context.Context, b Batch) { f(ctx, b) }

// SampleObserver is the optional part of an Observer, found by type
// assertion: when Config.Observer implements it, every pass (also a
// failed one, not one stopped by its context or Close) ends with a
// sample of the store's live records per consumer and state —
// repository.Stats.CountRecords at the time Now returns once the pass is
// done. It is the hook for the record gauges of metrics.Metrics. A sample
// needs a cleaner implementing repository.Stats (every backend in this
// module does; run a janitor over Redis just for this, its cleanup is a
// no-op); with another cleaner no sample is taken. A sample reads the
// whole store once per pass (see repository.Stats). A failed sample is
// logged at Error level and skipped; it never fails the pass.
type SampleObserver interface {
	ObserveRecordCounts(ctx context.Context, s Sample)
}

// Sample is the store's live records at one moment, as SampleObserver
// receives it.
type Sample struct {
	// Now is the time the records were counted at.
	Now time.Time
	// Counts are the live records per consumer and state.
	Counts []repository.RecordCount
}

// BatchStarter is the optional part of an Observer, found by type
// assertion: when Config.Observer implements it, every batch begins with
// StartJanitorBatch (b holds Before only) and its DeleteExpired call runs
// in the context it returns, the one ObserveJanitorBatch then receives,
// so an Observer can start a span here and end it there (see package
// tracing).
type BatchStarter interface {
	StartJanitorBatch(ctx context.Context, b Batch) context.Context
}

// Observers returns an Observer reporting to every one of obs, in turn;
// each implementing BatchStarter starts the batch in the context the one
// before returned. It is a SampleObserver only if one of obs is, and
// its samples go to those: no records are counted for observers that
// take no samples. Nil entries are skipped.
func Observers(obs ...Observer) Observer {
	if fanout.Any[SampleObserver](obs) {
		return samplingObservers{obs}
	}
	return observers(obs)
}

type observers []Observer

// samplingObservers are observers of which one at least takes samples.
type samplingObservers struct{ observers }

func (o observers) StartJanitorBatch(ctx context.Context, b Batch) context.Context {
	return fanout.Start(ctx, o, b, BatchStarter.StartJanitorBatch)
}

func (o observers) ObserveJanitorBatch(ctx context.Context, b Batch) {
	fanout.Report(ctx, o, b, Observer.ObserveJanitorBatch)
}

func (o samplingObservers) ObserveRecordCounts(ctx context.Context, s Sample) {
	fanout.Report(ctx, o.observers, s, SampleObserver.ObserveRecordCounts)
}

// Config configures a Janitor. Zero fields take the documented defaults.
type Config struct {
	// Interval is how long Run waits after one pass before starting the
	// next. Default: DefaultInterval (1 minute).
	Interval time.Duration
	// BatchSize is the most records one statement deletes, which bounds
	// how long it holds its locks. Default: DefaultBatchSize (1000).
	BatchSize int
	// Pause is the least wait between two batches of one pass, so that
	// claims interleave with a large cleanup. The janitor also waits at
	// least as long as the previous batch took, so it holds the table (on
	// SQLite: the database's only write lock) at most half of the time
	// while it drains a backlog. Default: DefaultPause (30 ms).
	Pause time.Duration
	// Now returns the current time; a pass deletes the records that
	// expired before the time Now returns when the pass starts. Default:
	// time.Now. Set it in tests.
	Now func() time.Time
	// Observer, if set, receives every batch and, if it implements
	// SampleObserver, a sample of the records after every pass; if it
	// implements BatchStarter (as tracing.New(tp) does, with a span per
	// batch), the start of every batch. Default: nil (none).
	Observer Observer
	// Logger receives the janitor's logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	settings.Default(&c.Interval, DefaultInterval)
	settings.Default(&c.BatchSize, DefaultBatchSize)
	settings.Default(&c.Pause, DefaultPause)
	settings.Logger(&c.Logger)
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports whether the configuration is usable. Run it after
// defaults are applied: it rejects zero values as well as negative ones.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, settings.Positive("interval", c.Interval))
	errs = append(errs, settings.Positive("batch size", c.BatchSize))
	if c.Pause < 0 {
		errs = append(errs, fmt.Errorf("pause must not be negative, got %s", c.Pause))
	}
	if c.Now == nil {
		errs = append(errs, errors.New("now function is nil"))
	}
	return errors.Join(errs...)
}

// Janitor deletes expired inbox records in bounded batches. All its
// methods are safe for concurrent use; several janitors (one per process)
// may clean the same table at once.
type Janitor struct {
	cleaner repository.Cleaner
	stats   repository.Stats // the cleaner, when it and Config.Observer sample
	config  Config
	logger  watermill.LoggerAdapter

	// closed is done when Close is called; every pass stops on it.
	closed     context.Context
	closeFn    context.CancelFunc
	mu         sync.Mutex
	isClosed   bool
	running    bool
	inProgress sync.WaitGroup // Run loops, RunOnce calls, plugin goroutines
}

// NewJanitor returns a Janitor that deletes expired records through
// cleaner. It starts nothing: call Run, RunOnce or RouterPlugin.
func NewJanitor(cleaner repository.Cleaner, config Config) (*Janitor, error) {
	config.setDefaults()
	switch err := config.Validate(); {
	case cleaner == nil:
		return nil, errors.New("janitor: cleaner is nil")
	case err != nil:
		return nil, fmt.Errorf("janitor: invalid config: %w", err)
	}
	var stats repository.Stats
	if _, ok := config.Observer.(SampleObserver); ok {
		if stats, ok = cleaner.(repository.Stats); !ok {
			config.Logger.Info("Inbox janitor takes no record samples: the cleaner does not implement repository.Stats", watermill.LogFields{"cleaner": fmt.Sprintf("%T", cleaner)})
		}
	}
	closed, closeFn := context.WithCancel(context.Background())
	return &Janitor{
		cleaner: cleaner,
		stats:   stats,
		config:  config,
		logger:  config.Logger,
		closed:  closed,
		closeFn: closeFn,
	}, nil
}

// RunOnce runs one pass: it deletes, batch after batch, the records that
// expired before Config.Now(), until a batch deletes fewer than BatchSize
// (the backlog is drained; records skipped because a claim held them
// locked are left for the next pass). It returns how many records it
// deleted, also on error. It stops early, with ctx's error, when ctx is
// done or Close is called. A failed batch ends the pass; the records it
// did not delete are still there for the next one. The pass is logged as
// Run logs it: Info with counts and duration, Error on failure. Like every
// pass, it ends with a sample for a SampleObserver.
func (j *Janitor) RunOnce(ctx context.Context) (int, error) {
	if err := j.enter(false); err != nil {
		return 0, err
	}
	defer j.inProgress.Done()
	ctx, cancel := j.untilClosed(ctx)
	defer cancel()
	return j.pass(ctx)
}

// Run runs a pass at once and then every Interval, until ctx is done or
// Close is called; then it returns nil. A failed pass is logged at Error
// level and retried at the next interval: Run does not return pass errors.
// It returns ErrRunning if another Run is in progress and ErrClosed after
// Close.
func (j *Janitor) Run(ctx context.Context) error {
	if err := j.enter(true); err != nil {
		return err
	}
	defer j.leaveRun()
	ctx, cancel := j.untilClosed(ctx)
	defer cancel()
	j.loop(ctx)
	return nil
}

// RouterPlugin returns a Watermill router plugin that starts Run in the
// background when the router runs, and stops it when the router has closed
// (noticed within a fraction of a second: Watermill v1.5 gives plugins no
// close signal, so the janitor polls Router.IsClosed) or when Close is
// called. Call Close after the router's Run returns to wait until the
// janitor has stopped:
//
//	router.AddPlugin(j.RouterPlugin())
//	defer j.Close()
//	err := router.Run(ctx)
//
// The plugin fails the router's start with ErrRunning or ErrClosed.
func (j *Janitor) RouterPlugin() message.RouterPlugin {
	return func(r *message.Router) error {
		if err := j.enter(true); err != nil {
			return err
		}
		// The context ends with Close or with the router; both goroutines
		// are counted in inProgress, so Close waits for them.
		ctx, cancel := j.untilClosed(context.Background())
		loopDone := make(chan struct{})
		j.inProgress.Add(1) // the Add for the loop keeps the counter above zero
		go func() {
			defer j.inProgress.Done()
			defer cancel()
			ticker := time.NewTicker(routerPollInterval)
			defer ticker.Stop()
			for {
				select {
				case <-loopDone:
					return
				case <-ticker.C:
					if r.IsClosed() {
						return
					}
				}
			}
		}()
		go func() {
			defer j.leaveRun()
			defer close(loopDone)
			j.loop(ctx)
		}()
		return nil
	}
}

// Close stops Run, a pass in progress and the router plugin, and waits
// until they have returned: no goroutine of the janitor outlives Close.
// It is idempotent and always returns nil.
func (j *Janitor) Close() error {
	j.mu.Lock()
	if !j.isClosed {
		j.isClosed = true
		j.closeFn()
	}
	j.mu.Unlock()
	j.inProgress.Wait()
	return nil
}

// enter registers work with Close. Under mu, so that no Add races with the
// Wait in Close.
func (j *Janitor) enter(run bool) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.isClosed {
		return ErrClosed
	}
	if run {
		if j.running {
			return ErrRunning
		}
		j.running = true
	}
	j.inProgress.Add(1)
	return nil
}

func (j *Janitor) leaveRun() {
	j.mu.Lock()
	j.running = false
	j.mu.Unlock()
	j.inProgress.Done()
}

// untilClosed derives a context from ctx that also ends when Close is
// called.
func (j *Janitor) untilClosed(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(j.closed, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

func (j *Janitor) loop(ctx context.Context) {
	j.logger.Info("Inbox janitor started", watermill.LogFields{
		"interval":   j.config.Interval,
		"batch_size": j.config.BatchSize,
	})
	for {
		// A failed pass is logged by pass and retried at the next interval:
		// the records it did not delete stay until a pass succeeds.
		_, _ = j.pass(ctx)
		if wait(ctx, j.config.Interval) != nil {
			j.logger.Info("Inbox janitor stopped", nil)
			return
		}
	}
}

// pass deletes expired records batch by batch and logs the outcome: Info
// with the counts when it removed something, Error when a batch failed.
// Then it samples the records for a SampleObserver.
func (j *Janitor) pass(ctx context.Context) (int, error) {
	defer j.sample(ctx)
	start := time.Now()
	before := j.config.Now()
	deleted, batches, err := j.drain(ctx, before)
	fields := watermill.LogFields{
		"deleted":  deleted,
		"batches":  batches,
		"duration": time.Since(start),
		"before":   before,
	}
	switch {
	case err != nil && ctx.Err() != nil:
		j.logger.Info("Inbox janitor pass stopped", fields)
	case err != nil:
		j.logger.Error("Inbox janitor pass failed", err, fields)
	case deleted > 0:
		j.logger.Info("Inbox janitor removed expired records", fields)
	default:
		j.logger.Debug("Inbox janitor found no expired records", fields)
	}
	return deleted, err
}

func (j *Janitor) drain(ctx context.Context, before time.Time) (deleted, batches int, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return deleted, batches, fmt.Errorf("janitor: %w", err)
		}
		n, took, err := j.batch(ctx, before)
		deleted += n
		batches++
		if err != nil {
			return deleted, batches, fmt.Errorf("janitor: delete expired records: %w", err)
		}
		if n < j.config.BatchSize {
			return deleted, batches, nil
		}
		// Waiting as long as the batch took bounds the janitor's share of
		// the database to half, whatever the backend and its load: claims
		// that queued behind a slow batch get at least as long to run.
		// SQLite waiters poll for the lock (sleeping up to 100 ms between
		// tries), so a gap shorter than a batch is easily missed there.
		if err := wait(ctx, max(j.config.Pause, took)); err != nil {
			return deleted, batches, fmt.Errorf("janitor: %w", err)
		}
	}
}

// batch deletes one batch of records that expired before before and
// reports it to the Observer.
func (j *Janitor) batch(ctx context.Context, before time.Time) (int, time.Duration, error) {
	if s, ok := j.config.Observer.(BatchStarter); ok {
		ctx = s.StartJanitorBatch(ctx, Batch{Before: before})
	}
	start := time.Now()
	n, err := j.cleaner.DeleteExpired(ctx, before, j.config.BatchSize)
	took := time.Since(start)
	if j.config.Observer != nil {
		j.config.Observer.ObserveJanitorBatch(ctx, Batch{Deleted: n, Duration: took, Before: before, Err: err})
	}
	return n, took, err
}

// sample reports the records counted now to a SampleObserver, unless
// there is none (or no repository.Stats to count them) or ctx is done. A failed count is logged, not returned: the gauges
// keep their last values until a sample succeeds.
func (j *Janitor) sample(ctx context.Context) {
	if j.stats == nil || ctx.Err() != nil {
		return
	}
	now := j.config.Now()
	counts, err := j.stats.CountRecords(ctx, now)
	switch {
	case err != nil && ctx.Err() != nil:
		j.logger.Debug("Inbox janitor sample stopped", watermill.LogFields{"now": now})
	case err != nil:
		j.logger.Error("Inbox janitor could not sample records", err, watermill.LogFields{"now": now})
	default:
		j.config.Observer.(SampleObserver).ObserveRecordCounts(ctx, Sample{Now: now, Counts: counts})
	}
}

// wait returns nil after d, or ctx's error if ctx ends first.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
