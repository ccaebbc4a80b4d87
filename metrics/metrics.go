// Package metrics exposes the inbox, janitor and outbox as Prometheus
// metrics, registered on a registerer the caller supplies. Nothing is
// registered globally: without a registerer there are no metrics.
//
//	reg := prometheus.NewRegistry()
//	m, err := metrics.New(metrics.Config{Registerer: reg})
//	if err != nil { … }
//	inbox, err := middleware.NewInbox(middleware.Config{…, Consumer: "shop", Observer: m})
//	jan, err := janitor.NewJanitor(repo, janitor.Config{Observer: m})
//	relay, err := outbox.NewRelay(db, publisher, outbox.RelayConfig{
//		Dialect:  postgres.Dialect,
//		Name:     "orders", // the relay label
//		Observer: m,
//	})
//
// One Metrics value is the Observer of every part: the inboxes
// (idempotency.Observer), package once and httpidem (the same interface),
// the janitor (janitor.Observer and janitor.SampleObserver) and the
// outbox relay (outbox.RelayObserver and outbox.BacklogObserver).
//
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// See docs/observability.md for the metric list and suggested alerts.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
)

// DefaultNamespace prefixes every metric name.
const DefaultNamespace = "watermill_idempotent"

// Config configures Metrics.
type Config struct {
	// Registerer receives the collectors. Required.
	Registerer prometheus.Registerer
	// Namespace prefixes metric names. Default: DefaultNamespace.
	Namespace string
	// LatencyBuckets are the histogram buckets, in seconds, of the claim
	// and transaction latencies and of relay batch durations. Default:
	// 0.5 ms to 10 s.
	LatencyBuckets []float64
	// LagBuckets are the histogram buckets, in seconds, of the relay lag.
	// Default: 5 ms to 1 h — an outbox that waited out a broker outage
	// has lags of minutes.
	LagBuckets []float64
}

func (c *Config) setDefaults() {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.LatencyBuckets == nil {
		c.LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	}
	if c.LagBuckets == nil {
		c.LagBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	}
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error {
	if c.Registerer == nil {
		return errors.New("metrics: missing Config.Registerer")
	}
	return nil
}

// Metrics collects the library's metrics. It implements every observer
// interface of the module: idempotency.Observer, janitor.Observer,
// janitor.SampleObserver, outbox.RelayObserver and
// outbox.BacklogObserver. It is safe for concurrent use.
type Metrics struct {
	deliveries     *prometheus.CounterVec
	claimSeconds   *prometheus.HistogramVec
	txSeconds      *prometheus.HistogramVec
	records        *prometheus.GaugeVec
	janitorDeleted prometheus.Counter
	janitorErrors  prometheus.Counter

	relayPublished  *prometheus.CounterVec
	relayFailed     *prometheus.CounterVec
	relayDead       *prometheus.CounterVec
	relayDeadFailed *prometheus.CounterVec
	relayLag        *prometheus.HistogramVec
	relayBatch      *prometheus.HistogramVec
	outboxBacklog   *prometheus.GaugeVec
	outboxOldestAge *prometheus.GaugeVec
	outboxDead      *prometheus.GaugeVec

	// sampleMu orders ObserveRecordCounts calls; it guards the fields
	// below, the last sample applied.
	sampleMu        sync.Mutex
	sampledAt       time.Time
	sampledConsumer map[string]bool
}

// New creates the collectors and registers them on config.Registerer.
func New(config Config) (*Metrics, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	b := builder{ns: config.Namespace, reg: config.Registerer}
	m := &Metrics{
		deliveries:      b.counterVec("deliveries_total", "Deliveries handled by an inbox, by consumer and outcome (processed, duplicate, replayed, payload_mismatch, no_key, no_scope, stale_version, lease_busy, needs_intervention, failed).", "consumer", "outcome"),
		claimSeconds:    b.histogramVec("claim_duration_seconds", "Time to claim a deduplication key (conditional insert, and reading the stored record on a duplicate).", config.LatencyBuckets, "consumer"),
		txSeconds:       b.histogramVec("transaction_duration_seconds", "Time a delivery spends in the inbox: claim, handler and commit (or completion in two-phase mode).", config.LatencyBuckets, "consumer", "outcome"),
		records:         b.gaugeVec("records", "Inbox records by consumer and state (in_progress: two-phase claims with a live lease; stale: in progress under an expired lease; completed: not yet expired), as last sampled.", "consumer", "state"),
		janitorDeleted:  b.counter("janitor_deleted_records_total", "Expired inbox records deleted by the janitor."),
		janitorErrors:   b.counter("janitor_errors_total", "Janitor batches that failed."),
		relayPublished:  b.counterVec("relay_published_messages_total", "Messages an outbox relay published and acknowledged, by relay.", "relay"),
		relayFailed:     b.counterVec("relay_failed_batches_total", "Outbox relay batches that failed (database or publisher error) and were retried, by relay.", "relay"),
		relayDead:       b.counterVec("relay_dead_lettered_messages_total", "Outbox rows a relay moved to the dead-letter table (refused by the publisher MaxAttempts times, or undecodable), by relay.", "relay"),
		relayDeadFailed: b.counterVec("relay_dead_letter_failures_total", "Outbox rows due for the dead-letter table that a relay could not move there (the table dropped or not writable, a full disk); each stays in the outbox and is tried again, by relay.", "relay"),
		relayLag:        b.histogramVec("relay_lag_seconds", "Time from an outbox row's created_at (database clock) until the relay published it, one sample per published message, by relay.", config.LagBuckets, "relay"),
		relayBatch:      b.histogramVec("relay_batch_duration_seconds", "Duration of outbox relay batches that claimed rows, from BEGIN to COMMIT, by relay.", config.LatencyBuckets, "relay"),
		outboxBacklog:   b.gaugeVec("outbox_backlog_messages", "Rows in the outbox table not yet acknowledged by a relay, as last sampled by the relay.", "relay"),
		outboxOldestAge: b.gaugeVec("outbox_oldest_message_age_seconds", "Age of the oldest row in the outbox table (database clock; 0 when empty), as last sampled by the relay.", "relay"),
		outboxDead:      b.gaugeVec("outbox_dead_letters", "Rows in the outbox's dead-letter table, waiting for an operator, as last sampled by the relay.", "relay"),
	}
	if b.err != nil {
		return nil, b.err
	}
	return m, nil
}

// builder makes the collectors of one Metrics under its namespace and
// registers each as it is made, in order; after the first refusal it
// registers nothing more and err says why.
type builder struct {
	ns  string
	reg prometheus.Registerer
	err error
}

func (b *builder) register(c prometheus.Collector) {
	if b.err != nil {
		return
	}
	if err := b.reg.Register(c); err != nil {
		b.err = fmt.Errorf("metrics: register: %w", err)
	}
}

func (b *builder) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: b.ns, Name: name, Help: help})
	b.register(c)
	return c
}

func (b *builder) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: b.ns, Name: name, Help: help}, labels)
	b.register(c)
	return c
}

func (b *builder) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: b.ns, Name: name, Help: help}, labels)
	b.register(g)
	return g
}

func (b *builder) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: b.ns, Name: name, Help: help, Buckets: buckets}, labels)
	b.register(h)
	return h
}

// ObserveDelivery implements idempotency.Observer.
func (m *Metrics) ObserveDelivery(_ context.Context, d idempotency.Delivery) {
	m.deliveries.WithLabelValues(d.Scope, string(d.Outcome)).Inc()
	if d.Outcome != idempotency.OutcomeNoKey && d.Outcome != idempotency.OutcomeNoScope { // nothing was claimed
		m.claimSeconds.WithLabelValues(d.Scope).Observe(d.Claim.Seconds())
	}
	m.txSeconds.WithLabelValues(d.Scope, string(d.Outcome)).Observe(d.Total.Seconds())
}

// ObserveJanitorBatch implements janitor.Observer: it counts a janitor
// batch.
func (m *Metrics) ObserveJanitorBatch(_ context.Context, b janitor.Batch) {
	m.janitorDeleted.Add(float64(b.Deleted))
	if b.Err != nil {
		m.janitorErrors.Inc()
	}
}

// SetRecords sets the sampled number of records of a consumer in a state
// ("in_progress", "stale" or "completed"), for callers that count records
// themselves; ObserveRecordCounts is the usual source.
func (m *Metrics) SetRecords(consumer, state string, n int) {
	m.records.WithLabelValues(consumer, state).Set(float64(n))
}

// The values of the records gauge's state label.
const (
	stateInProgress = "in_progress"
	stateStale      = "stale"
	stateCompleted  = "completed"
)

// ObserveRecordCounts sets the records gauge from a sample taken at now:
// in_progress, stale and completed for every consumer in counts. A
// consumer that was in the previous sample but is missing from this one
// has no live records left, so its three series drop to 0 rather than
// keep their last values. Each call replaces the previous sample, so feed
// it from one source (one janitor per Metrics); a sample older than the
// last one applied is ignored, so two passes finishing out of order do
// not roll the gauges back. It implements janitor.SampleObserver.
func (m *Metrics) ObserveRecordCounts(_ context.Context, s janitor.Sample) {
	now, counts := s.Now, s.Counts
	m.sampleMu.Lock()
	defer m.sampleMu.Unlock()
	if now.Before(m.sampledAt) {
		return
	}
	seen := make(map[string]bool, len(counts))
	for _, c := range counts {
		seen[c.Consumer] = true
		m.records.WithLabelValues(c.Consumer, stateInProgress).Set(float64(c.InProgress))
		m.records.WithLabelValues(c.Consumer, stateStale).Set(float64(c.Stale))
		m.records.WithLabelValues(c.Consumer, stateCompleted).Set(float64(c.Completed))
	}
	for consumer := range m.sampledConsumer {
		if !seen[consumer] {
			for _, state := range []string{stateInProgress, stateStale, stateCompleted} {
				m.records.WithLabelValues(consumer, state).Set(0)
			}
		}
	}
	m.sampledAt, m.sampledConsumer = now, seen
}

// Metrics is the observer of every part of the module.
var _ interface {
	idempotency.Observer
	janitor.Observer
	janitor.SampleObserver
	outbox.RelayObserver
	outbox.BacklogObserver
} = (*Metrics)(nil)

// relaySeries are one relay's counters and histograms.
type relaySeries struct {
	published, failed, deadLettered, deadLetterFailures prometheus.Counter
	lag, batch                                          prometheus.Observer
}

func (m *Metrics) relay(name string) relaySeries {
	return relaySeries{
		published:          m.relayPublished.WithLabelValues(name),
		failed:             m.relayFailed.WithLabelValues(name),
		deadLettered:       m.relayDead.WithLabelValues(name),
		deadLetterFailures: m.relayDeadFailed.WithLabelValues(name),
		lag:                m.relayLag.WithLabelValues(name),
		batch:              m.relayBatch.WithLabelValues(name),
	}
}

// ObserveRelayBatch implements outbox.RelayObserver: under the relay
// label b.Relay (RelayConfig.Name) it counts the published and
// dead-lettered messages, the failed moves to the dead-letter table and
// the failed batches, and observes each
// message's lag and the duration of a batch that claimed rows. Relays
// sharing a name share the series: give relays on different outbox
// tables different names, and aggregate replicas of one relay with sum
// (counters, histograms) or max (gauges).
func (m *Metrics) ObserveRelayBatch(_ context.Context, b outbox.RelayBatch) {
	r := m.relay(b.Relay)
	r.published.Add(float64(b.Published))
	r.deadLettered.Add(float64(b.DeadLettered))
	r.deadLetterFailures.Add(float64(b.DeadLetterFailures))
	if b.Err != nil {
		r.failed.Inc()
	}
	for _, l := range b.Lag {
		r.lag.Observe(l.Seconds())
	}
	if b.Claimed > 0 {
		r.batch.Observe(b.Duration.Seconds())
	}
}

// ObserveBacklog implements outbox.BacklogObserver: it sets the backlog
// and dead-letter gauges of the relay b.Relay. A relay samples its
// backlog as soon as Run starts, so its counters and histograms exist
// (at 0) from then on, not only from its first batch.
func (m *Metrics) ObserveBacklog(_ context.Context, b outbox.Backlog) {
	m.relay(b.Relay)
	m.outboxBacklog.WithLabelValues(b.Relay).Set(float64(b.Messages))
	m.outboxOldestAge.WithLabelValues(b.Relay).Set(b.OldestAge.Seconds())
	m.outboxDead.WithLabelValues(b.Relay).Set(float64(b.DeadLetters))
}
