package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/internal/sqlstore"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Relay defaults.
const (
	DefaultBatchSize           = 500
	DefaultMaxBatchBytes       = 16 << 20
	DefaultMaxAttempts         = 10
	DefaultCloseTimeout        = 30 * time.Second
	DefaultPollInterval        = 100 * time.Millisecond
	DefaultNotifyPollInterval  = time.Second
	DefaultRelayRetryInterval  = time.Second
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
	// before it is moved to the dead-letter table (see ForwardBatch for
	// when a failure is charged; a publisher outage is not). Rows whose
	// metadata cannot be decoded are moved at once. Default:
	// DefaultMaxAttempts (10).
	MaxAttempts int
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
	// Metrics receives a report per batch and, if it also implements
	// BacklogObserver, a Backlog sample every BacklogInterval while Run
	// runs. Default: nil (none).
	Metrics RelayMetrics
	// BacklogInterval is how often Run samples Backlog for a Metrics
	// that implements BacklogObserver; each sample counts the table's
	// rows. Default: DefaultBacklogInterval (15s). Unused otherwise.
	BacklogInterval time.Duration
}

func (c *RelayConfig) setDefaults() {
	if c.Table == "" {
		c.Table = DefaultTableName
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.CloseTimeout == 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
	if c.PollInterval == 0 {
		if c.notify() {
			c.PollInterval = DefaultNotifyPollInterval
		} else {
			c.PollInterval = DefaultPollInterval
		}
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = DefaultRelayRetryInterval
	}
	if c.BacklogInterval == 0 {
		c.BacklogInterval = DefaultBacklogInterval
	}
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
	if c.MaxBatchBytes <= 0 {
		errs = append(errs, fmt.Errorf("RelayConfig.MaxBatchBytes must be positive, got %d", c.MaxBatchBytes))
	}
	if c.MaxAttempts <= 0 {
		errs = append(errs, fmt.Errorf("RelayConfig.MaxAttempts must be positive, got %d", c.MaxAttempts))
	}
	if c.CloseTimeout <= 0 {
		errs = append(errs, fmt.Errorf("RelayConfig.CloseTimeout must be positive, got %s", c.CloseTimeout))
	}
	if c.PollInterval <= 0 {
		errs = append(errs, fmt.Errorf("RelayConfig.PollInterval must be positive, got %s", c.PollInterval))
	}
	if c.RetryInterval <= 0 {
		errs = append(errs, fmt.Errorf("RelayConfig.RetryInterval must be positive, got %s", c.RetryInterval))
	}
	if c.BacklogInterval <= 0 {
		errs = append(errs, fmt.Errorf("RelayConfig.BacklogInterval must be positive, got %s", c.BacklogInterval))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid relay config: %w", err)
	}
	return nil
}

// RelayMetrics receives the relay's measurements; metrics.RelayObserver
// implements it for Prometheus. Methods are called on the relay's goroutine, so
// they must be fast; they must be safe for concurrent use when one value
// is shared by several relays.
type RelayMetrics interface {
	// BatchForwarded reports a batch that claimed at least one row,
	// including one that failed partway (then Published < Claimed).
	BatchForwarded(BatchStats)
	// BatchFailed reports a batch that failed; the relay retries after
	// RelayConfig.RetryInterval.
	BatchFailed(err error)
}

// BacklogObserver is an optional extension of RelayMetrics: when
// RelayConfig.Metrics implements it, Run samples Backlog when it starts
// and then every RelayConfig.BacklogInterval, on a goroutine of its own,
// and reports each successful sample. A failed sample is logged and
// skipped. ObserveBacklog must be safe for concurrent use with the
// RelayMetrics methods.
type BacklogObserver interface {
	ObserveBacklog(Backlog)
}

// Backlog is the state of the outbox table at one moment.
type Backlog struct {
	// Messages is the number of rows not yet acknowledged, including
	// rows claimed by a batch in flight.
	Messages int
	// OldestAge is the age of the oldest row by the database's clock
	// (now minus its created_at); 0 when the outbox is empty.
	OldestAge time.Duration
	// DeadLetters is the number of rows in the dead-letter table.
	DeadLetters int
}

// BatchStats describes one relay batch.
type BatchStats struct {
	// Claimed is the number of rows read and locked.
	Claimed int
	// Published is the number of messages published and acknowledged
	// (deleted) in the batch's commit — 0 if the commit failed.
	Published int
	// DeadLettered is the number of rows moved to the dead-letter table
	// in the batch's commit.
	DeadLettered int
	// Duration is the batch's wall time from BEGIN to COMMIT.
	Duration time.Duration
	// Lag holds, for each of the Published messages in publish order,
	// the time from its row's created_at until its Publish call
	// returned. The part up to the statement that reads the row is
	// measured by the database's clock (created_at is the writing
	// transaction's start on PostgreSQL and the INSERT on MySQL, in the
	// session time zone, so writers and relay must share one), the rest
	// by the relay's
	// monotonic clock, so skew between the two clocks does not enter.
	// A negative age (the database clock stepped back) counts as 0.
	Lag []time.Duration
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

	// isolating is set after a Publish failure: the next batches publish
	// in halves until one has no failure.
	isolating atomic.Bool

	stop    chan struct{} // closed by Close
	mu      sync.Mutex
	running bool
	closed  bool
	abort   context.CancelCauseFunc // cancels the batch in flight
	done    chan struct{}
}

// NewRelay returns a relay reading the outbox in db and publishing to
// publisher. logger may be nil (watermill.NopLogger). The relay does not
// close db or publisher.
func NewRelay(db *sql.DB, publisher message.Publisher, config RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	return NewRelayOn(sqlstore.StdDB(db), publisher, config, logger)
}

// NewRelayOn is NewRelay on a pool of any driver, for this module's
// driver packages (pgxoutbox.NewRelay runs the relay on a pgxpool.Pool);
// use NewRelay or pgxoutbox.NewRelay.
func NewRelayOn(db sqlstore.DB, publisher message.Publisher, config RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
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
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Relay{
		db:              db,
		pub:             publisher,
		config:          config,
		d:               newDialect(config.Dialect, config.Table),
		deadLetterTable: DeadLetterTableName(config.Table),
		logger:          logger.With(watermill.LogFields{"outbox_table": config.Table}),
		stop:            make(chan struct{}),
	}, nil
}

// Run forwards batches until ctx ends or Close is called. After a batch
// that published or dead-lettered something it looks again at once; after
// an empty one it waits for a NOTIFY (PostgreSQL with a Notifier) or
// PollInterval. A failed batch is logged, reported to Metrics and retried
// after RetryInterval: database or broker outages do not end Run.
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
	if bo, ok := r.config.Metrics.(BacklogObserver); ok {
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

	timer := time.NewTimer(0)
	defer timer.Stop()
	for r.active(ctx) {
		res, err := r.forwardBatch(batchCtx)
		if !r.active(ctx) || batchCtx.Err() != nil {
			break
		}
		var pause time.Duration
		switch {
		case err != nil:
			r.logger.Error("Outbox relay batch failed, retrying", err, watermill.LogFields{
				"published": len(res.lag), "dead_lettered": res.deadLettered, "retry_in": r.config.RetryInterval,
			})
			pause = r.config.RetryInterval
		case res.progressed():
			continue
		default:
			pause = r.config.PollInterval
		}
		timer.Reset(pause)
		select {
		case <-ctx.Done():
		case <-r.stop:
		case <-timer.C:
		case <-wake:
			if err != nil {
				// A failed batch waits its retry interval even when woken.
				select {
				case <-ctx.Done():
				case <-r.stop:
				case <-timer.C:
				}
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
	if ctx.Err() == nil {
		return nil // closed
	}
	return ctx.Err()
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

// sampleBacklog reports Backlog to o now and every BacklogInterval until
// ctx ends.
func (r *Relay) sampleBacklog(ctx context.Context, o BacklogObserver) {
	ticker := time.NewTicker(r.config.BacklogInterval)
	defer ticker.Stop()
	for {
		b, err := r.Backlog(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.logger.Error("Outbox backlog sample failed", err, nil)
		default:
			o.ObserveBacklog(b)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Backlog counts the outbox's rows, the age of the oldest and the rows of
// the dead-letter table with one query, a full scan of both tables
// (COUNT(*) and MIN(created_at)). It takes
// no locks: rows claimed by a batch in flight are counted until that
// batch commits. Safe to call at any time, concurrently with Run.
func (r *Relay) Backlog(ctx context.Context) (Backlog, error) {
	var n, dead int
	var ageMicros int64
	if err := r.db.QueryRow(ctx, r.d.backlog.SQL(), r.d.backlog.Args(time.Now().UnixMicro())...).Scan(&n, &ageMicros, &dead); err != nil {
		return Backlog{}, fmt.Errorf("outbox: relay: backlog: %w", err)
	}
	return Backlog{Messages: n, OldestAge: microseconds(ageMicros), DeadLetters: dead}, nil
}

// microseconds converts an age computed by the database, never negative.
func microseconds(n int64) time.Duration {
	return time.Duration(max(n, 0)) * time.Microsecond
}

type claimedRow struct {
	id       int64
	topic    string
	msg      *message.Message
	attempts int
	// created is when the row was written, on the relay's clock: the
	// start of the fetch query less the row's age at it, by the
	// database's clock.
	created time.Time
	// undecodable is set when the row's metadata is not a JSON object
	// of strings: publishing it can never succeed.
	undecodable error
}

// ForwardBatch forwards one batch and returns the number of messages
// published and acknowledged (deleted). Run calls it in a loop; call it
// yourself to drain the outbox from a cron job or a test. It is safe to
// call from several goroutines and processes at once: SKIP LOCKED gives
// each caller different rows.
//
// A batch is one transaction: claim up to BatchSize rows in id order,
// cut to MaxBatchBytes (a larger row goes alone), read them, publish them
// (consecutive rows of one topic in one Publish call), delete the
// published rows, charge failed attempts and move dead letters, commit.
//
// If a Publish call fails, the batch stops there: the messages published
// before it are acknowledged and the error is returned; the rest stay in
// the outbox, and the next batch isolates the failure by publishing in
// halves down to single rows, so the rows around a poison row flow. A row
// whose own Publish fails is charged one attempt when another message of
// that batch was accepted, or when it was the batch's only row; a batch
// in which two rows were tried and none accepted is treated as a
// publisher outage and charges nothing. A row reaching MaxAttempts, and a
// row whose metadata cannot be decoded, is moved to the dead-letter table
// in the transaction that deletes it (see DeadLetters). If ctx ends or
// the commit fails, nothing is acknowledged or charged and everything
// claimed is published again later.
func (r *Relay) ForwardBatch(ctx context.Context) (int, error) {
	res, err := r.forwardBatch(ctx)
	return len(res.lag), err
}

// forwardBatch runs forward and reports it to Metrics.
func (r *Relay) forwardBatch(ctx context.Context) (batchResult, error) {
	start := time.Now()
	res, err := r.forward(ctx)
	if m := r.config.Metrics; m != nil {
		if res.claimed > 0 {
			m.BatchForwarded(BatchStats{
				Claimed: res.claimed, Published: len(res.lag), DeadLettered: res.deadLettered,
				Duration: time.Since(start), Lag: res.lag,
			})
		}
		if err != nil && ctx.Err() == nil {
			m.BatchFailed(err)
		}
	}
	return res, err
}

// batchResult is what one batch committed.
type batchResult struct {
	claimed      int
	lag          []time.Duration // one per published and acknowledged message
	deadLettered int
}

// progressed reports whether the batch changed the outbox, so Run looks
// again at once.
func (b batchResult) progressed() bool { return len(b.lag) > 0 || b.deadLettered > 0 }

// Row states within a batch.
const (
	rowPending = iota
	rowPublished
	rowFailed
)

// batchPublish publishes the rows of one batch and records each row's
// fate.
type batchPublish struct {
	r        *Relay
	rows     []claimedRow
	state    []int
	errs     []error // per failed row, the error of its own Publish
	order    []int   // published rows in publish order
	lag      []time.Duration
	accepted int
	stopped  bool // isolating found no accepted message in two rows: an outage
}

// publish sends the rows idx, all of one topic, in one Publish call.
func (p *batchPublish) publish(idx []int) error {
	msgs := make([]*message.Message, len(idx))
	for k, i := range idx {
		msgs[k] = p.rows[i].msg
	}
	if err := p.r.pub.Publish(p.rows[idx[0]].topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	for _, i := range idx {
		p.state[i] = rowPublished
		p.order = append(p.order, i)
		p.lag = append(p.lag, now.Sub(p.rows[i].created))
	}
	p.accepted += len(idx)
	return nil
}

// topicRuns splits the decodable rows into runs of consecutive rows of
// one topic.
func (p *batchPublish) topicRuns() [][]int {
	var runs [][]int
	for i, row := range p.rows {
		if row.undecodable != nil {
			continue
		}
		if n := len(runs); n > 0 && p.rows[runs[n-1][0]].topic == row.topic {
			runs[n-1] = append(runs[n-1], i)
			continue
		}
		runs = append(runs, []int{i})
	}
	return runs
}

// inOrder publishes run after run and stops at the first failure,
// returning it; the failed run and everything after it stay pending.
func (p *batchPublish) inOrder() error {
	for _, run := range p.topicRuns() {
		if err := p.publish(run); err != nil {
			return fmt.Errorf("outbox: relay: publish %d messages to %q: %w", len(run), p.rows[run[0]].topic, err)
		}
	}
	return nil
}

// isolate publishes every run, splitting a run whose Publish fails in
// halves down to single rows, so one row the publisher refuses does not
// hold back the others. While nothing of the batch has been accepted, a
// single failed row is followed by a probe of the batch's last pending
// row: if that fails too, the publisher is presumed down and the batch
// stops, after about log2(BatchSize)+1 calls.
func (p *batchPublish) isolate() {
	for _, run := range p.topicRuns() {
		p.bisect(run)
	}
}

func (p *batchPublish) bisect(idx []int) {
	if p.stopped {
		return
	}
	pending := make([]int, 0, len(idx))
	for _, i := range idx {
		if p.state[i] == rowPending {
			pending = append(pending, i)
		}
	}
	if len(pending) == 0 {
		return
	}
	err := p.publish(pending)
	switch {
	case err == nil:
	case len(pending) == 1:
		p.state[pending[0]], p.errs[pending[0]] = rowFailed, err
		if p.accepted == 0 {
			p.probe()
		}
	default:
		mid := len(pending) / 2
		p.bisect(pending[:mid])
		p.bisect(pending[mid:])
	}
}

// probe publishes the last pending row alone: whether the publisher
// accepts anything at all.
func (p *batchPublish) probe() {
	for j := len(p.rows) - 1; j >= 0; j-- {
		if p.state[j] != rowPending || p.rows[j].undecodable != nil {
			continue
		}
		if err := p.publish([]int{j}); err != nil {
			p.state[j], p.errs[j] = rowFailed, err
			p.stopped = true
		}
		return
	}
}

// failed returns the rows whose own Publish failed, in id order.
func (p *batchPublish) failed() []int {
	var out []int
	for i, s := range p.state {
		if s == rowFailed {
			out = append(out, i)
		}
	}
	return out
}

// deadLetter is a row moved to the dead-letter table.
type deadLetter struct {
	row      claimedRow
	attempts int
	err      error
}

// errNoCommit ends a batch that changed nothing: roll back.
var errNoCommit = errors.New("outbox: relay: nothing to commit")

// forward runs one batch; see ForwardBatch.
func (r *Relay) forward(ctx context.Context) (res batchResult, err error) {
	var (
		began, fnFailed bool
		pubErr          error
		p               *batchPublish
		dead            []deadLetter
		charged         []deadLetter
	)
	// READ COMMITTED: on InnoDB the locking read then takes no gap locks,
	// so writers inserting new rows never wait for the relay.
	err = r.db.InTx(ctx, true, func(tx sqlstore.Executor) error {
		began = true
		var err error
		p, dead, charged, pubErr, err = r.batch(ctx, tx, &res)
		fnFailed = err != nil
		return err
	})
	switch {
	case !began && err != nil:
		return res, fmt.Errorf("outbox: relay: begin: %w", err)
	case errors.Is(err, errNoCommit):
		return res, pubErr
	case fnFailed:
		return res, errors.Join(pubErr, err)
	case err != nil:
		return res, errors.Join(pubErr, fmt.Errorf("outbox: relay: commit: %w", err))
	}
	res.lag, res.deadLettered = p.lag, len(dead)

	for _, d := range charged {
		r.logger.Info("Outbox relay: publisher refused a message, will retry", watermill.LogFields{
			"message_uuid": d.row.msg.UUID, "topic": d.row.topic, "outbox_id": d.row.id,
			"attempts": d.attempts, "max_attempts": r.config.MaxAttempts, "error": d.err.Error(),
		})
	}
	for _, d := range dead {
		r.logger.Error("Outbox relay: message moved to the dead-letter table", d.err, watermill.LogFields{
			"message_uuid": d.row.msg.UUID, "topic": d.row.topic, "outbox_id": d.row.id,
			"attempts": d.attempts, "dead_letter_table": r.deadLetterTable,
		})
	}
	r.logger.Trace("Outbox relay batch", watermill.LogFields{"claimed": res.claimed, "published": len(p.lag), "dead_lettered": len(dead)})
	return res, pubErr
}

// batch claims, publishes and acknowledges in tx. It returns errNoCommit
// when there is nothing to write, and a database error (without pubErr)
// that rolls the batch back.
func (r *Relay) batch(ctx context.Context, tx sqlstore.Executor, res *batchResult) (p *batchPublish, dead, charged []deadLetter, pubErr, err error) {
	batch, err := r.claim(ctx, tx)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	res.claimed = len(batch)
	if len(batch) == 0 {
		return nil, nil, nil, nil, errNoCommit
	}

	p = &batchPublish{r: r, rows: batch, state: make([]int, len(batch)), errs: make([]error, len(batch))}
	var charge []int
	if r.isolating.Load() {
		p.isolate()
		failed := p.failed()
		switch {
		case len(failed) == 0:
			r.isolating.Store(false)
		case p.accepted == 0 && len(failed) > 1:
			// Nothing accepted, two rows refused: the publisher, not
			// the rows. Charge nothing.
			pubErr = fmt.Errorf("outbox: relay: publisher refused every message tried (%d): %w", len(failed), p.errs[failed[0]])
		default:
			charge = failed
			pubErr = fmt.Errorf("outbox: relay: publisher refused %d of %d messages, each alone; first: %w", len(failed), len(batch), p.errs[failed[0]])
		}
	} else if pubErr = p.inOrder(); pubErr != nil {
		r.isolating.Store(true)
	}

	for _, row := range batch {
		if row.undecodable != nil {
			dead = append(dead, deadLetter{row: row, attempts: row.attempts, err: row.undecodable})
		}
	}
	for _, i := range charge {
		d := deadLetter{row: batch[i], attempts: batch[i].attempts + 1, err: p.errs[i]}
		if d.attempts >= r.config.MaxAttempts {
			dead = append(dead, d)
		} else {
			charged = append(charged, d)
		}
	}
	if p.accepted == 0 && len(dead) == 0 && len(charged) == 0 {
		return p, nil, nil, pubErr, errNoCommit
	}

	if p.accepted > 0 {
		ids := make([]int64, len(p.order))
		for k, i := range p.order {
			ids[k] = batch[i].id
		}
		if _, err := tx.Exec(ctx, r.d.deleteAcked.SQL(), r.d.deleteAcked.Args(r.d.ids(ids))...); err != nil {
			return p, dead, charged, pubErr, fmt.Errorf("outbox: relay: acknowledge %d rows: %w", len(ids), err)
		}
	}
	for _, d := range charged {
		if _, err := tx.Exec(ctx, r.d.charge.SQL(), r.d.charge.Args(d.row.id)...); err != nil {
			return p, dead, charged, pubErr, fmt.Errorf("outbox: relay: count attempt of row %d: %w", d.row.id, err)
		}
	}
	for _, d := range dead {
		if _, err := tx.Exec(ctx, r.d.deadLetter.SQL(), r.d.deadLetter.Args(d.row.id, d.attempts-d.row.attempts, errorText(d.err), time.Now().UnixMicro())...); err != nil {
			return p, dead, charged, pubErr, fmt.Errorf("outbox: relay: dead-letter row %d: %w", d.row.id, err)
		}
		if _, err := tx.Exec(ctx, r.d.deleteOne.SQL(), r.d.deleteOne.Args(d.row.id)...); err != nil {
			return p, dead, charged, pubErr, fmt.Errorf("outbox: relay: dead-letter row %d: %w", d.row.id, err)
		}
	}
	return p, dead, charged, pubErr, nil
}

// maxErrorText bounds the last_error stored with a dead letter.
const maxErrorText = 4000

// errorText is err's message as both databases accept it in a text
// column: valid UTF-8, without NUL bytes, at most maxErrorText bytes. A
// publisher error may echo arbitrary bytes; refusing them would fail the
// batch's commit forever.
func errorText(err error) string {
	s := strings.ReplaceAll(strings.ToValidUTF8(err.Error(), "\uFFFD"), "\x00", "")
	if len(s) <= maxErrorText {
		return s
	}
	cut := maxErrorText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// claimWindows is how many windows of BatchSize rows a MySQL claim
// looks at when every row of a window is locked by other relays.
const claimWindows = 4

// claim locks up to BatchSize rows in id order, keeps the longest prefix
// within MaxBatchBytes (at least one row) and reads those rows, sorted by
// id. On PostgreSQL, rows locked beyond the prefix stay in the table and
// are skipped by other relays until this batch ends.
func (r *Relay) claim(ctx context.Context, tx sqlstore.Executor) ([]claimedRow, error) {
	after := int64(math.MinInt64)
	for range claimWindows {
		ids, err := r.claimWindow(ctx, tx, after)
		if err != nil || len(ids) == 0 {
			return nil, err
		}
		batch, err := r.fetch(ctx, tx, ids)
		if err != nil || len(batch) > 0 || r.d.claimLocks() {
			return batch, err
		}
		// MySQL: other relays hold every row of this prefix; look past
		// it.
		after = ids[len(ids)-1]
	}
	return nil, nil
}

// claimWindow returns the ids of the next rows after id after that fit
// MaxBatchBytes (at least one).
func (r *Relay) claimWindow(ctx context.Context, tx sqlstore.Executor, after int64) ([]int64, error) {
	rows, err := tx.Query(ctx, r.d.claim.SQL(), r.d.claim.Args(after, r.config.BatchSize)...)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	defer rows.Close()
	var ids []int64
	var total int64
	full := false
	for rows.Next() {
		var id, size int64
		if err := rows.Scan(&id, &size); err != nil {
			return nil, fmt.Errorf("outbox: relay: claim: %w", err)
		}
		// Read on to the end: on PostgreSQL every row the query
		// returns is locked anyway, and the result is small.
		if full || (len(ids) > 0 && total+size > int64(r.config.MaxBatchBytes)) {
			full = true
			continue
		}
		ids = append(ids, id)
		total += size
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	return ids, nil
}

// fetch reads the rows ids; on MySQL it also locks them, skipping rows
// locked by others.
func (r *Relay) fetch(ctx context.Context, tx sqlstore.Executor, ids []int64) ([]claimedRow, error) {
	// The rows' ages are taken at the statement's start, and start is a
	// moment on the relay's clock just before it: a row's lag counts no
	// part of the claim twice.
	start := time.Now()
	rows, err := tx.Query(ctx, r.d.fetch.SQL(), r.d.fetch.Args(r.d.ids(ids), start.UnixMicro())...)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: read claimed rows: %w", err)
	}
	defer rows.Close()
	batch := make([]claimedRow, 0, len(ids))
	for rows.Next() {
		var (
			row             claimedRow
			uuid            string
			payload, mdJSON []byte
			ageMicros       int64
		)
		if err := rows.Scan(&row.id, &row.topic, &uuid, &payload, &mdJSON, &row.attempts, &ageMicros); err != nil {
			return nil, fmt.Errorf("outbox: relay: scan: %w", err)
		}
		row.created = start.Add(-microseconds(ageMicros))
		row.msg = message.NewMessage(uuid, payload)
		// A publisher that honours the message's context gives up when
		// the batch is abandoned (ctx ends, Close times out).
		row.msg.SetContext(ctx)
		if len(mdJSON) > 0 {
			if err := json.Unmarshal(mdJSON, &row.msg.Metadata); err != nil {
				// It can never be published: dead-letter it at once
				// rather than block the outbox or skip it silently.
				row.undecodable = fmt.Errorf("outbox: relay: row %d: metadata is not a JSON object of strings: %w", row.id, err)
			}
			if row.msg.Metadata == nil {
				row.msg.Metadata = message.Metadata{}
			}
		}
		batch = append(batch, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: relay: read claimed rows: %w", err)
	}
	slices.SortFunc(batch, func(a, b claimedRow) int { return cmp.Compare(a.id, b.id) })
	return batch, nil
}
