package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/sqldialect"
	"github.com/idemkit/watermill-idempotent/sqlexec"
)

// Relay defaults.
const (
	DefaultBatchSize           = 500
	DefaultMaxBatchBytes       = 16 << 20
	DefaultMaxAttempts         = 10
	DefaultMinRefusalSpan      = 5 * time.Minute
	DefaultCloseTimeout        = 30 * time.Second
	DefaultPollInterval        = 100 * time.Millisecond
	DefaultNotifyPollInterval  = time.Second
	DefaultRelayRetryInterval  = time.Second
	DefaultMaxRetryInterval    = 30 * time.Second
	DefaultBacklogInterval     = 15 * time.Second
	defaultListenRetryInterval = time.Second
)

var (
	// ErrRelayClosed is returned by Run after Close.
	ErrRelayClosed = errors.New("outbox: relay is closed")
	// ErrCloseTimeout is returned by Close when the batch in flight did
	// not finish within RelayConfig.CloseTimeout (typically a Publish
	// call that blocks). That batch is abandoned: its rows stay in the
	// outbox and are published again.
	ErrCloseTimeout = errors.New("outbox: relay close timed out")
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Dialect is the database flavour; it must match the Outbox's.
	// Required.
	Dialect sqldialect.Dialect
	// Table is the outbox table; it must match the Outbox's. Default:
	// DefaultTableName.
	Table string
	// BatchSize is the most rows claimed, published and acknowledged in
	// one transaction. Larger batches raise throughput and the number of
	// messages published again after a crash. Default: DefaultBatchSize
	// (500); at most 10,000.
	BatchSize int
	// MaxBatchBytes bounds a batch by size as well: the relay reads the
	// sizes of the claimed rows (payload, metadata, UUID and topic) first
	// and then only the longest prefix within MaxBatchBytes, so its memory
	// stays near MaxBatchBytes whatever the rows weigh. A single larger
	// row still goes, alone. Default: DefaultMaxBatchBytes (16 MiB).
	MaxBatchBytes int
	// MaxAttempts is how many failed publishes are charged to a row
	// before it is moved to the dead-letter table. A refusal is charged
	// when its error is permanent (IsPermanent), when the row's topic
	// accepted another message after the row was first refused, or when
	// the row was charged before; a refusal while the topic accepts
	// nothing is not, so a topic outage charges nothing however long it
	// lasts (see ForwardBatch). Rows
	// whose metadata cannot be decoded are moved at once. Default:
	// DefaultMaxAttempts (10).
	MaxAttempts int
	// MinRefusalSpan is the least time from the first refused Publish
	// call that held a row to the refusal that moves it to the
	// dead-letter table, when that refusal's error is not known to be
	// permanent. A row's charges show that its topic accepted other
	// messages while the row was refused; they do not show that the row
	// is to blame rather than its partition (a Kafka leader election, a
	// broker restarting behind a load balancer), which a refusal
	// outlasting such events does. A row charged MaxAttempts-1 times
	// waits for the span without further charges (Run backs off
	// meanwhile, and the row holds back no other); a row refused with a
	// permanent error does not wait. Default: DefaultMinRefusalSpan (5
	// minutes): longer than leader elections and rolling restarts, short
	// enough that a poison row refused with an error nobody classified
	// is set aside within minutes.
	MinRefusalSpan time.Duration
	// IsPermanent reports whether a Publish error means the message can
	// never be published (over the broker's size limit, an invalid
	// topic), so the row is charged the attempt even when its topic
	// accepted nothing else, and is moved at MaxAttempts without waiting
	// for MinRefusalSpan: it reaches the dead-letter table in a quiet
	// outbox. It sees the publisher's error as returned, once per row
	// refused alone. Return false for anything that may be the broker's
	// (a refused connection, a timeout, a leader election, an
	// authorization failure): a wrong true dead-letters healthy messages
	// during an outage.
	// Watermill's publishers return the client library's errors wrapped,
	// so errors.Is finds them:
	//
	//	IsPermanent: func(err error) bool {
	//		return outbox.IsPermanent(err) || errors.Is(err, sarama.ErrMessageSizeTooLarge)
	//	}
	//
	// Default: IsPermanent (errors wrapping ErrPermanent).
	IsPermanent func(error) bool
	// CloseTimeout bounds Close: it lets the batch in flight finish
	// (publish, acknowledge, commit) for at most this long, then cancels
	// it and returns ErrCloseTimeout. Default: DefaultCloseTimeout (30s,
	// as Watermill's router).
	CloseTimeout time.Duration
	// PollInterval is how long the relay waits after finding the outbox
	// empty before it looks again. With a Notifier it is only the
	// fallback (rows claimed by a relay that then died, a lost listener
	// connection). Default: DefaultNotifyPollInterval (1s) with a
	// Notifier, DefaultPollInterval (100ms) otherwise.
	PollInterval time.Duration
	// Notifier wakes the relay when a transaction that wrote outbox rows
	// commits, so it need not poll often. On PostgreSQL use
	// pgxoutbox.Notifier (database/sql with the pgx stdlib driver) or
	// pgxoutbox.PoolNotifier (pgxpool; pgxoutbox.NewRelay sets it): the
	// shipped trigger sends NOTIFY on commit and they LISTEN. It lives
	// there so that MySQL and SQLite programs never link pgx. Default: nil
	// (poll only). Ignored on MySQL and SQLite, which send no NOTIFY.
	Notifier Notifier
	// DisableNotify ignores Notifier, leaving polling only. Default: false.
	DisableNotify bool
	// RetryInterval is the pause after a failed batch (database or
	// publisher error) before the next attempt. Default:
	// DefaultRelayRetryInterval (1s).
	RetryInterval time.Duration
	// MaxRetryInterval caps the backoff: after consecutive failed
	// batches that wrote nothing (the database or the publisher is down,
	// or every row left is refused with an error not known to be
	// permanent), the pause doubles from RetryInterval up to
	// MaxRetryInterval; a batch that writes anything resets it. With the
	// defaults an outage costs about 6 batches in its first minute and 2
	// a minute after that. Default: DefaultMaxRetryInterval (30s), or
	// RetryInterval if that is longer.
	MaxRetryInterval time.Duration
	// Name names the relay in its reports to Observer (the relay label
	// of metrics.Metrics). Give relays on different outbox tables
	// different names; replicas of one relay share one. Default: Table.
	Name string
	// Observer receives a report per batch that claimed rows or failed
	// and, if it also implements BacklogObserver, a Backlog sample every
	// BacklogInterval while Run runs. metrics.Metrics implements both;
	// tracing.New(tp) gives each batch a span (see RelayBatchStarter);
	// RelayObservers combines several. Default: nil (none).
	Observer RelayObserver
	// Logger receives the relay's logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// BacklogInterval is how often Run samples Backlog for an Observer
	// that implements BacklogObserver; each sample counts the table's
	// rows. Default: DefaultBacklogInterval (15s). Unused otherwise.
	BacklogInterval time.Duration
}

func (c *RelayConfig) setDefaults() {
	settings.Default(&c.Table, DefaultTableName)
	settings.Default(&c.Name, c.Table)
	settings.Logger(&c.Logger)
	settings.Default(&c.BatchSize, DefaultBatchSize)
	settings.Default(&c.MaxBatchBytes, DefaultMaxBatchBytes)
	settings.Default(&c.MaxAttempts, DefaultMaxAttempts)
	settings.Default(&c.MinRefusalSpan, DefaultMinRefusalSpan)
	settings.Default(&c.CloseTimeout, DefaultCloseTimeout)
	if c.PollInterval == 0 {
		if c.notify() {
			c.PollInterval = DefaultNotifyPollInterval
		} else {
			c.PollInterval = DefaultPollInterval
		}
	}
	settings.Default(&c.RetryInterval, DefaultRelayRetryInterval)
	if c.MaxRetryInterval == 0 {
		c.MaxRetryInterval = max(DefaultMaxRetryInterval, c.RetryInterval)
	}
	if c.IsPermanent == nil {
		c.IsPermanent = IsPermanent
	}
	settings.Default(&c.BacklogInterval, DefaultBacklogInterval)
}

func (c RelayConfig) notify() bool {
	return c.Dialect == sqldialect.PostgreSQL && c.Notifier != nil && !c.DisableNotify
}

// Notifier wakes a relay when rows commit: see RelayConfig.Notifier.
type Notifier interface {
	// Listen listens on channel (Relay.NotifyChannel) until ctx ends or
	// its connection fails, calling wake once it listens (to catch up on
	// commits it may have missed) and after every notification. It
	// returns ctx's error, or the failure; the relay polls meanwhile and
	// calls Listen again after a second. An error wrapping
	// errors.ErrUnsupported (the connection cannot LISTEN) ends listening
	// for good: the relay logs it and polls.
	Listen(ctx context.Context, channel string, wake func()) error
}

// Validate reports every problem with the configuration at once.
func (c RelayConfig) Validate() error {
	var errs []error
	if err := (Config{Dialect: c.Dialect, Table: c.Table}).Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.BatchSize <= 0 || c.BatchSize > 10_000 {
		errs = append(errs, fmt.Errorf("RelayConfig.BatchSize must be in 1..10000, got %d", c.BatchSize))
	}
	errs = append(errs, settings.Positive("RelayConfig.MaxBatchBytes", c.MaxBatchBytes))
	errs = append(errs, settings.Positive("RelayConfig.MaxAttempts", c.MaxAttempts))
	errs = append(errs, settings.Positive("RelayConfig.MinRefusalSpan", c.MinRefusalSpan))
	errs = append(errs, settings.Positive("RelayConfig.CloseTimeout", c.CloseTimeout))
	errs = append(errs, settings.Positive("RelayConfig.PollInterval", c.PollInterval))
	errs = append(errs, settings.Positive("RelayConfig.RetryInterval", c.RetryInterval))
	if c.MaxRetryInterval < c.RetryInterval {
		errs = append(errs, fmt.Errorf("RelayConfig.MaxRetryInterval must be at least RetryInterval (%s), got %s", c.RetryInterval, c.MaxRetryInterval))
	}
	errs = append(errs, settings.Positive("RelayConfig.BacklogInterval", c.BacklogInterval))
	return settings.Invalid("relay", errs)
}

// Relay forwards messages from the outbox table to a Watermill publisher.
//
// Each batch is one transaction: claim up to BatchSize rows (and at most
// MaxBatchBytes) in id order with SELECT … FOR UPDATE SKIP LOCKED,
// publish them (consecutive rows of one topic in one Publish call),
// delete the published rows, commit. Delivery is at least once with
// UUIDs, metadata and payload unchanged: a crash or a cancelled context
// after publishing and before the commit leaves the rows in place, and
// they are published again. A row is never skipped: it is deleted only
// after it was published or moved to the dead-letter table (a row the
// publisher refused MaxAttempts times, or whose metadata cannot be
// decoded), and a row whose transaction commits late is simply claimed
// when it becomes visible.
//
// Order: with one relay, messages of one transaction are published in
// insertion order, and a transaction that committed before another began
// has its messages published first. Several relays on one table never
// claim the same row at once, but their batches run in parallel, so there
// is no order across batches. See docs/outbox.md.
//
// A Relay holds no goroutine until Run; Run's goroutines stop before it
// returns.
type Relay struct {
	db              sqlstore.DB
	pub             message.Publisher
	config          RelayConfig
	d               dialect
	deadLetterTable string
	logger          watermill.LoggerAdapter

	// hist is what the relay's batches learnt about each topic and the
	// rows refused, for the next ones.
	hist *history
	// moveFailures rate-limits the log of failed dead-letter moves.
	moveFailures moveFailureLog

	stop    chan struct{} // closed by Close
	mu      sync.Mutex
	running bool
	closed  bool
	abort   context.CancelCauseFunc // cancels the batch in flight
	done    chan struct{}
}

// NewRelay returns a relay reading the outbox in db and publishing to
// publisher. The relay does not close db or publisher.
func NewRelay(db *sql.DB, publisher message.Publisher, config RelayConfig) (*Relay, error) {
	return NewRelayOn(sqlexec.Std(db), publisher, config)
}

// NewRelayOn is NewRelay on a pool of any driver behind sqlexec.DB
// (pgxoutbox.NewRelay passes a pgxpool.Pool through pgxexec.Pool).
func NewRelayOn(db sqlexec.DB, publisher message.Publisher, config RelayConfig) (*Relay, error) {
	if db == nil {
		return nil, errors.New("outbox: relay: db is nil")
	}
	if publisher == nil {
		return nil, errors.New("outbox: relay: publisher is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Relay{
		db:              db,
		pub:             publisher,
		config:          config,
		d:               newDialect(config.Dialect, config.Table),
		deadLetterTable: DeadLetterTableName(config.Table),
		logger:          config.Logger.With(watermill.LogFields{"outbox_table": config.Table}),
		hist:            newHistory(max(10*config.MaxRetryInterval, config.MinRefusalSpan)),
		stop:            make(chan struct{}),
	}, nil
}

// Run forwards batches until ctx ends or Close is called. After a batch
// that published or dead-lettered something it looks again at once; after
// an empty one it waits for a NOTIFY (PostgreSQL with a Notifier) or
// PollInterval. A failed batch is logged, reported to Observer and retried
// after RetryInterval, doubled after each further failed batch that wrote
// nothing up to MaxRetryInterval: database or broker outages do not end
// Run, and cost it a bounded number of attempts. A batch that did nothing
// but fail to move rows to the dead-letter table backs off the same way.
//
// Run returns nil after Close, ctx's error when ctx ends, ErrRelayClosed
// if the relay was closed before, and an error if Run is already running.
// When it returns, every goroutine it started has stopped. After Close,
// the batch in flight finished first (published and acknowledged: nothing
// is published twice) unless it outlasted CloseTimeout; when ctx ends,
// the batch in flight is abandoned and its rows will be published again.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrRelayClosed
	}
	if r.running {
		r.mu.Unlock()
		return errors.New("outbox: relay is already running")
	}
	// Batches run on batchCtx, which Close does not cancel (it only
	// stops the loop) unless the batch outlasts CloseTimeout.
	batchCtx, abort := context.WithCancelCause(ctx)
	loopCtx, stopLoop := context.WithCancel(ctx)
	done := make(chan struct{})
	r.running, r.abort, r.done = true, abort, done
	r.mu.Unlock()

	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer func() {
		stopLoop()
		abort(nil)
		wg.Wait()
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
		close(done)
	}()
	if bo, ok := r.config.Observer.(BacklogObserver); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.sampleBacklog(loopCtx, bo)
		}()
	}
	if r.config.notify() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(loopCtx, wake)
		}()
	}

	r.loop(ctx, batchCtx, wake)
	if ctx.Err() == nil {
		return nil // closed
	}
	return ctx.Err()
}

// loop runs batches until ctx ends or Close: at once after a batch that
// removed rows, after PollInterval (or a wake-up) after an empty one, and
// after retryPause after a failed one.
func (r *Relay) loop(ctx, batchCtx context.Context, wake <-chan struct{}) {
	failures := 0 // consecutive failed batches, the last ones wrote nothing
	for r.active(ctx) {
		res, err := r.forwardBatch(batchCtx)
		if !r.active(ctx) || batchCtx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			if res.committed() {
				failures = 0
			}
			failures++
			pause := r.retryPause(failures)
			r.logger.Error("Outbox relay batch failed, retrying", err, watermill.LogFields{
				"published": len(res.lag), "dead_lettered": res.deadLettered, "charged": res.charged,
				"failed_batches": failures, "retry_in": pause,
			})
			// A failed batch waits its pause even when woken.
			r.wait(ctx, pause, nil)
		case res.progressed():
			failures = 0
		case res.failedMoves > 0:
			// All the batch did was fail to move rows to the dead-letter
			// table: they come back in the next batch. Back off as after a
			// failed batch; the failures are logged apart, rate-limited.
			failures++
			r.wait(ctx, r.retryPause(failures), nil)
		default:
			failures = 0
			r.wait(ctx, r.config.PollInterval, wake)
		}
	}
}

// retryPause is the pause after the n-th failed batch in a row (n >= 1):
// RetryInterval doubled n-1 times, at most MaxRetryInterval.
func (r *Relay) retryPause(n int) time.Duration {
	d := r.config.RetryInterval
	for i := 1; i < n && d < r.config.MaxRetryInterval; i++ {
		d *= 2
	}
	return min(d, r.config.MaxRetryInterval)
}

// wait pauses for d, or until ctx ends, Close is called or wake (nil:
// never) signals.
func (r *Relay) wait(ctx context.Context, d time.Duration, wake <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-r.stop:
	case <-t.C:
	case <-wake:
	}
}

// Running reports whether Run is running: it has started and not yet
// returned (after Close or the end of its context, or a crash of the
// goroutine that called it). Health checks use it; it is safe to call
// at any time.
func (r *Relay) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// active reports whether Run should start another batch.
func (r *Relay) active(ctx context.Context) bool {
	select {
	case <-r.stop:
		return false
	default:
		return ctx.Err() == nil
	}
}

// Close stops Run and makes later Run calls return ErrRelayClosed. It is
// graceful: Run starts no new batch, and the batch in flight finishes —
// its messages are published and acknowledged, so a clean shutdown
// publishes nothing twice. Close waits for Run to return for at most
// CloseTimeout; then it cancels the batch (its rows stay in the outbox and
// are published again; a publisher that honours the messages' context
// gives up) and returns ErrCloseTimeout without waiting further — Run
// returns once the blocked call does. Close is idempotent and safe to call
// concurrently with Run.
func (r *Relay) Close() error {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.stop)
	}
	running, abort, done := r.running, r.abort, r.done
	r.mu.Unlock()
	if !running {
		return nil
	}
	timer := time.NewTimer(r.config.CloseTimeout)
	defer timer.Stop()
	select {
	case <-done:
		return nil
	case <-timer.C:
		err := fmt.Errorf("%w: the batch in flight did not finish within %s and was abandoned (its messages will be published again)",
			ErrCloseTimeout, r.config.CloseTimeout)
		abort(err)
		return err
	}
}
