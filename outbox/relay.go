package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// Relay defaults.
const (
	DefaultBatchSize           = 500
	DefaultPollInterval        = 100 * time.Millisecond
	DefaultNotifyPollInterval  = time.Second
	DefaultRelayRetryInterval  = time.Second
	DefaultBacklogInterval     = 15 * time.Second
	defaultListenRetryInterval = time.Second
)

// ErrRelayClosed is returned by Run after Close.
var ErrRelayClosed = errors.New("outbox: relay is closed")

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Dialect is the database flavour; it must match the Outbox's.
	// Required.
	Dialect Dialect
	// Table is the outbox table; it must match the Outbox's. Default:
	// DefaultTableName.
	Table string
	// BatchSize is the most rows claimed, published and acknowledged in
	// one transaction. Larger batches raise throughput and the number of
	// messages published again after a crash. Default: DefaultBatchSize
	// (500); at most 10,000.
	BatchSize int
	// PollInterval is how long the relay waits after finding the outbox
	// empty before it looks again. On PostgreSQL with LISTEN/NOTIFY it is
	// only the fallback (rows claimed by a relay that then died, a lost
	// listener connection). Default: DefaultNotifyPollInterval (1s) when
	// NOTIFY is used, DefaultPollInterval (100ms) otherwise.
	PollInterval time.Duration
	// DisableNotify turns LISTEN/NOTIFY off on PostgreSQL, leaving polling
	// only. LISTEN needs the pgx/v5 stdlib driver ("pgx"); with another
	// driver the relay logs that once and polls. Default: false. Ignored
	// on MySQL.
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

func (c RelayConfig) notify() bool { return c.Dialect == PostgreSQL && !c.DisableNotify }

// Validate reports every problem with the configuration at once.
func (c RelayConfig) Validate() error {
	var errs []error
	if err := (Config{Dialect: c.Dialect, Table: c.Table}).Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.BatchSize <= 0 || c.BatchSize > 10_000 {
		errs = append(errs, fmt.Errorf("RelayConfig.BatchSize must be in 1..10000, got %d", c.BatchSize))
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
}

// BatchStats describes one relay batch.
type BatchStats struct {
	// Claimed is the number of rows read and locked.
	Claimed int
	// Published is the number of messages published and acknowledged
	// (deleted) in the batch's commit — 0 if the commit failed.
	Published int
	// Duration is the batch's wall time from BEGIN to COMMIT.
	Duration time.Duration
	// Lag holds, for each of the Published messages in publish order,
	// the time from its row's created_at until its Publish call
	// returned. The part up to the claim is measured by the database's
	// clock (created_at is the writing transaction's start on
	// PostgreSQL and the INSERT on MySQL, in the session time zone, so
	// writers and relay must share one), the rest by the relay's
	// monotonic clock, so skew between the two clocks does not enter.
	// A negative age (the database clock stepped back) counts as 0.
	Lag []time.Duration
}

// Relay forwards messages from the outbox table to a Watermill publisher.
//
// Each batch is one transaction: claim up to BatchSize rows in id order
// with SELECT … FOR UPDATE SKIP LOCKED, publish them (consecutive rows of
// one topic in one Publish call), delete the published rows, commit.
// Delivery is at least once with UUIDs, metadata and payload unchanged: a
// crash or a cancelled context after publishing and before the commit
// leaves the rows in place, and they are published again. A row is never
// skipped: it is deleted only after it was published, and a row whose
// transaction commits late is simply claimed when it becomes visible.
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
	db     *sql.DB
	pub    message.Publisher
	config RelayConfig
	d      dialect
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	running bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

// NewRelay returns a relay reading the outbox in db and publishing to
// publisher. logger may be nil (watermill.NopLogger). The relay does not
// close db or publisher.
func NewRelay(db *sql.DB, publisher message.Publisher, config RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
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
		db:     db,
		pub:    publisher,
		config: config,
		d:      newDialect(config.Dialect, config.Table),
		logger: logger.With(watermill.LogFields{"outbox_table": config.Table}),
	}, nil
}

// Run forwards batches until ctx ends or Close is called. After a batch
// that published something it looks again at once; after an empty one it
// waits for a NOTIFY (PostgreSQL) or PollInterval. A failed batch is
// logged, reported to Metrics and retried after RetryInterval: database or
// broker outages do not end Run.
//
// Run returns nil after Close, ctx's error when ctx ends, ErrRelayClosed
// if the relay was closed before, and an error if Run is already running.
// When it returns, every goroutine it started has stopped; the batch in
// flight, if any, was abandoned (its rows will be published again).
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
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	r.running, r.cancel, r.done = true, cancel, done
	r.mu.Unlock()

	wake := make(chan struct{}, 1)
	var wg sync.WaitGroup
	defer func() {
		cancel()
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
			r.sampleBacklog(ctx, bo)
		}()
	}
	if r.config.notify() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.listen(ctx, wake)
		}()
	}

	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		n, err := r.ForwardBatch(ctx)
		if ctx.Err() != nil {
			break
		}
		var pause time.Duration
		switch {
		case err != nil:
			r.logger.Error("Outbox relay batch failed, retrying", err, watermill.LogFields{"published": n, "retry_in": r.config.RetryInterval})
			pause = r.config.RetryInterval
		case n > 0:
			continue
		default:
			pause = r.config.PollInterval
		}
		timer.Reset(pause)
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-wake:
			if err != nil {
				// A failed batch waits its retry interval even when woken.
				select {
				case <-ctx.Done():
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
		if ctx.Err() != nil {
			break
		}
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed && parent.Err() == nil {
		return nil
	}
	return parent.Err()
}

// Close stops Run, waits until it has returned and makes later Run calls
// return ErrRelayClosed. The batch in flight is abandoned, not
// acknowledged. Close is idempotent and safe to call concurrently with Run.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	running, cancel, done := r.running, r.cancel, r.done
	r.mu.Unlock()
	if running {
		cancel()
		<-done
	}
	return nil
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

// Backlog counts the outbox's rows and the age of the oldest with one
// query, a full scan of the table (COUNT(*) and MIN(created_at)). It takes
// no locks: rows claimed by a batch in flight are counted until that
// batch commits. Safe to call at any time, concurrently with Run.
func (r *Relay) Backlog(ctx context.Context) (Backlog, error) {
	var n int
	var ageMicros int64
	if err := r.db.QueryRowContext(ctx, r.d.backlogSQL).Scan(&n, &ageMicros); err != nil {
		return Backlog{}, fmt.Errorf("outbox: relay: backlog: %w", err)
	}
	return Backlog{Messages: n, OldestAge: microseconds(ageMicros)}, nil
}

// microseconds converts an age computed by the database, never negative.
func microseconds(n int64) time.Duration {
	return time.Duration(max(n, 0)) * time.Microsecond
}

type claimedRow struct {
	id    int64
	topic string
	msg   *message.Message
	age   time.Duration // at the start of the claim query, by the database's clock
}

// ForwardBatch forwards one batch — claim up to BatchSize rows, publish,
// delete what was published, commit — and returns the number of messages
// published and acknowledged. Run calls it in a loop; call it yourself to
// drain the outbox from a cron job or a test. It is safe to call from
// several goroutines and processes at once: SKIP LOCKED gives each caller
// different rows.
//
// If the publisher fails partway, the messages published before the
// failing Publish call are acknowledged and the error is returned; the
// rest stay in the outbox. If ctx ends or the commit fails, nothing is
// acknowledged and everything claimed is published again later.
func (r *Relay) ForwardBatch(ctx context.Context) (int, error) {
	start := time.Now()
	claimed, lag, err := r.forward(ctx)
	published := len(lag)
	if m := r.config.Metrics; m != nil {
		if claimed > 0 {
			m.BatchForwarded(BatchStats{Claimed: claimed, Published: published, Duration: time.Since(start), Lag: lag})
		}
		if err != nil && ctx.Err() == nil {
			m.BatchFailed(err)
		}
	}
	return published, err
}

// forward returns the number of rows claimed and the lag of each message
// published and acknowledged.
func (r *Relay) forward(ctx context.Context) (claimed int, lag []time.Duration, err error) {
	// READ COMMITTED: on InnoDB the locking read then takes no gap locks,
	// so writers inserting new rows never wait for the relay.
	tx, err := r.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, nil, fmt.Errorf("outbox: relay: begin: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()

	// The rows' ages are taken at the claim statement's start; claimStart
	// is that moment on the relay's clock, a network hop earlier.
	claimStart := time.Now()
	batch, err := r.claim(ctx, tx)
	if err != nil {
		return 0, nil, err
	}
	if len(batch) == 0 {
		return 0, nil, nil
	}

	lag = make([]time.Duration, 0, len(batch))
	published := 0
	var pubErr error
	for i := 0; i < len(batch); {
		j := i + 1
		for j < len(batch) && batch[j].topic == batch[i].topic {
			j++
		}
		msgs := make([]*message.Message, j-i)
		for k := range msgs {
			msgs[k] = batch[i+k].msg
		}
		if err := r.pub.Publish(batch[i].topic, msgs...); err != nil {
			pubErr = fmt.Errorf("outbox: relay: publish %d messages to %q: %w", len(msgs), batch[i].topic, err)
			break
		}
		sinceClaim := time.Since(claimStart)
		for _, row := range batch[i:j] {
			lag = append(lag, row.age+sinceClaim)
		}
		i = j
		published = j
	}

	if published > 0 {
		ids := make([]int64, published)
		for i := range ids {
			ids[i] = batch[i].id
		}
		q, args := r.d.deleteQuery(ids)
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return len(batch), nil, errors.Join(pubErr, fmt.Errorf("outbox: relay: acknowledge %d rows: %w", published, err))
		}
		if err := tx.Commit(); err != nil {
			return len(batch), nil, errors.Join(pubErr, fmt.Errorf("outbox: relay: commit: %w", err))
		}
		committed = true
	}
	r.logger.Trace("Outbox relay batch", watermill.LogFields{"claimed": len(batch), "published": published})
	return len(batch), lag, pubErr
}

func (r *Relay) claim(ctx context.Context, tx *sql.Tx) ([]claimedRow, error) {
	rows, err := tx.QueryContext(ctx, r.d.selectSQL, r.config.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	defer rows.Close()
	batch := make([]claimedRow, 0, r.config.BatchSize)
	for rows.Next() {
		var (
			row             claimedRow
			uuid            string
			payload, mdJSON []byte
			ageMicros       int64
		)
		if err := rows.Scan(&row.id, &row.topic, &uuid, &payload, &mdJSON, &ageMicros); err != nil {
			return nil, fmt.Errorf("outbox: relay: scan: %w", err)
		}
		row.age = microseconds(ageMicros)
		row.msg = message.NewMessage(uuid, payload)
		if len(mdJSON) > 0 {
			if err := json.Unmarshal(mdJSON, &row.msg.Metadata); err != nil {
				// A row the relay cannot decode would block the outbox
				// forever if skipped silently; fail loudly instead.
				return nil, fmt.Errorf("outbox: relay: row %d: decode metadata: %w", row.id, err)
			}
			if row.msg.Metadata == nil {
				row.msg.Metadata = message.Metadata{}
			}
		}
		batch = append(batch, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: relay: claim: %w", err)
	}
	return batch, nil
}
