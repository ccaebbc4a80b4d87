// Package health serves liveness and readiness probes for a process that
// runs the inbox, an outbox relay and a janitor:
//
//	jh := health.NewJanitorStatus()
//	j, _ := janitor.NewJanitor(repo, janitor.Config{Observer: jh, Logger: logger})
//	h, _ := health.NewHandler(health.Config{DB: db, Relay: relay, Janitor: jh, Logger: logger})
//	mux.Handle("/livez", h.Liveness())
//	mux.Handle("/readyz", h.Readiness())
//
// Readiness asks everything the process depends on: the database answers
// a ping, the relay's Run is running and the oldest outbox row is younger
// than MaxBacklogAge, the janitor's last batch succeeded within
// MaxJanitorAge. Liveness asks only what a restart can fix — the relay's
// Run has not returned, the janitor still makes passes (failed or not) —
// so an outage of the database makes the process unready, never restarts
// it. Both answer 200 or 503 with a JSON body naming each check's status.
package health

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
)

// Defaults of Config.
const (
	DefaultTimeout       = 2 * time.Second
	DefaultMaxBacklogAge = 5 * time.Minute
	// DefaultMaxJanitorAge is three janitor intervals at the default
	// janitor.DefaultInterval.
	DefaultMaxJanitorAge = 3 * janitor.DefaultInterval
)

// Statuses of a check and of a response.
const (
	StatusOK   = "ok"
	StatusFail = "fail"
)

// Relay is what the relay check reads; *outbox.Relay implements it.
type Relay interface {
	Running() bool
	Backlog(ctx context.Context) (outbox.Backlog, error)
}

// Config configures a Handler. Every component is optional: a nil one is
// not checked. At least one must be set.
type Config struct {
	// DB is pinged (PingContext) by readiness. Default: nil.
	DB *sql.DB
	// Relay is checked by both probes: liveness wants Run running,
	// readiness also wants the oldest outbox row younger than
	// MaxBacklogAge. The backlog read is one COUNT(*)/MIN query, a scan
	// of the outbox table (see outbox.Relay.Backlog). Default: nil.
	Relay Relay
	// Janitor is the status a janitor reports to as its Observer (with
	// metrics too: janitor.Observers(m, status)).
	// Readiness wants a successful batch within MaxJanitorAge; liveness
	// wants any batch within MaxJanitorAge. Default: nil.
	Janitor *JanitorStatus
	// Timeout bounds each check that reads the database (ping,
	// backlog). Default: DefaultTimeout (2s).
	Timeout time.Duration
	// MaxBacklogAge is the oldest outbox row readiness accepts.
	// Default: DefaultMaxBacklogAge (5 minutes).
	MaxBacklogAge time.Duration
	// MaxJanitorAge is how long ago the janitor's last (successful) batch
	// may be; set it to a few janitor intervals. Default:
	// DefaultMaxJanitorAge (3 minutes).
	MaxJanitorAge time.Duration
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
	// Logger receives failed checks at Info. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxBacklogAge == 0 {
		c.MaxBacklogAge = DefaultMaxBacklogAge
	}
	if c.MaxJanitorAge == 0 {
		c.MaxJanitorAge = DefaultMaxJanitorAge
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	settings.Logger(&c.Logger)
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.DB == nil && c.Relay == nil && c.Janitor == nil {
		errs = append(errs, errors.New("nothing to check: set DB, Relay or Janitor"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("Config.Timeout must be positive, got %s", c.Timeout))
	}
	if c.MaxBacklogAge <= 0 {
		errs = append(errs, fmt.Errorf("Config.MaxBacklogAge must be positive, got %s", c.MaxBacklogAge))
	}
	if c.MaxJanitorAge <= 0 {
		errs = append(errs, fmt.Errorf("Config.MaxJanitorAge must be positive, got %s", c.MaxJanitorAge))
	}
	if c.Now == nil {
		errs = append(errs, errors.New("Config.Now is nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid health config: %w", err)
	}
	return nil
}

// JanitorStatus remembers the janitor's last batches. It is a
// janitor.Observer: pass it as janitor.Config.Observer (with
// janitor.Observers to report to metrics too). Safe for concurrent use.
type JanitorStatus struct {
	mu          sync.Mutex
	lastBatch   time.Time
	lastSuccess time.Time
	lastErr     error
	now         func() time.Time
}

// NewJanitorStatus returns a status that has seen no batch yet: until
// the janitor's first batch, both probes report the janitor as failing.
func NewJanitorStatus() *JanitorStatus { return &JanitorStatus{now: time.Now} }

// ObserveJanitorBatch implements janitor.Observer: it records one
// janitor batch. It never blocks for long.
func (s *JanitorStatus) ObserveJanitorBatch(_ context.Context, b janitor.Batch) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastBatch = now
	s.lastErr = b.Err
	if b.Err == nil {
		s.lastSuccess = now
	}
}

func (s *JanitorStatus) snapshot() (lastBatch, lastSuccess time.Time, lastErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastBatch, s.lastSuccess, s.lastErr
}

// Check is one check's answer in a Response.
type Check struct {
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// Details holds what the check measured (backlog, ages).
	Details map[string]any `json:"details,omitempty"`
}

// Response is the JSON body both probes write.
type Response struct {
	Status string           `json:"status"`
	Checks map[string]Check `json:"checks"`
}

// Handler answers the probes. Safe for concurrent use.
type Handler struct {
	config Config
	logger watermill.LoggerAdapter
}

// NewHandler returns the probes for the components in config; failed
// checks are logged at Info to config.Logger.
func NewHandler(config Config) (*Handler, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Handler{config: config, logger: config.Logger}, nil
}

// Liveness returns the liveness probe: the relay's Run is running and the
// janitor made a batch (failed or not) within MaxJanitorAge. It reads no
// database.
func (h *Handler) Liveness() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.write(w, h.Live(r.Context()))
	})
}

// Readiness returns the readiness probe: every check of Ready.
func (h *Handler) Readiness() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.write(w, h.Ready(r.Context()))
	})
}

// Live runs the liveness checks.
func (h *Handler) Live(ctx context.Context) Response {
	checks := map[string]Check{}
	if h.config.Relay != nil {
		c := Check{Status: StatusOK}
		if !h.config.Relay.Running() {
			c = Check{Status: StatusFail, Error: "relay is not running"}
		}
		checks["relay"] = c
	}
	if h.config.Janitor != nil {
		checks["janitor"] = h.janitor(false)
	}
	return response(checks)
}

// Ready runs the readiness checks: the database answers a ping within
// Timeout, the relay runs and its oldest row is younger than
// MaxBacklogAge, the janitor's last successful batch is within
// MaxJanitorAge and its last batch did not fail.
func (h *Handler) Ready(ctx context.Context) Response {
	checks := map[string]Check{}
	if h.config.DB != nil {
		checks["database"] = h.database(ctx)
	}
	if h.config.Relay != nil {
		checks["relay"] = h.relay(ctx)
	}
	if h.config.Janitor != nil {
		checks["janitor"] = h.janitor(true)
	}
	return response(checks)
}

func (h *Handler) database(ctx context.Context) Check {
	ctx, cancel := context.WithTimeout(ctx, h.config.Timeout)
	defer cancel()
	start := time.Now()
	if err := h.config.DB.PingContext(ctx); err != nil {
		return Check{Status: StatusFail, Error: "database does not answer: " + err.Error()}
	}
	return Check{Status: StatusOK, Details: map[string]any{"ping_seconds": time.Since(start).Seconds()}}
}

func (h *Handler) relay(ctx context.Context) Check {
	running := h.config.Relay.Running()
	ctx, cancel := context.WithTimeout(ctx, h.config.Timeout)
	defer cancel()
	b, err := h.config.Relay.Backlog(ctx)
	if err != nil {
		return Check{Status: StatusFail, Error: "reading the outbox backlog: " + err.Error(),
			Details: map[string]any{"running": running}}
	}
	c := Check{Status: StatusOK, Details: map[string]any{
		"running":            running,
		"backlog_messages":   b.Messages,
		"oldest_age_seconds": b.OldestAge.Seconds(),
		"dead_letters":       b.DeadLetters,
	}}
	switch {
	case !running:
		c.Status, c.Error = StatusFail, "relay is not running"
	case b.OldestAge > h.config.MaxBacklogAge:
		c.Status, c.Error = StatusFail, fmt.Sprintf("oldest outbox message is %s old, over %s", b.OldestAge.Round(time.Second), h.config.MaxBacklogAge)
	}
	return c
}

func (h *Handler) janitor(ready bool) Check {
	lastBatch, lastSuccess, lastErr := h.config.Janitor.snapshot()
	now := h.config.Now()
	c := Check{Status: StatusOK, Details: map[string]any{}}
	if !lastBatch.IsZero() {
		c.Details["last_batch_seconds_ago"] = now.Sub(lastBatch).Seconds()
	}
	if !lastSuccess.IsZero() {
		c.Details["last_success_seconds_ago"] = now.Sub(lastSuccess).Seconds()
	}
	switch {
	case lastBatch.IsZero():
		c.Status, c.Error = StatusFail, "janitor has made no pass yet"
	case now.Sub(lastBatch) > h.config.MaxJanitorAge:
		c.Status, c.Error = StatusFail, fmt.Sprintf("janitor's last pass was %s ago, over %s", now.Sub(lastBatch).Round(time.Second), h.config.MaxJanitorAge)
	case ready && lastErr != nil:
		c.Status, c.Error = StatusFail, "janitor's last pass failed: "+lastErr.Error()
	case ready && now.Sub(lastSuccess) > h.config.MaxJanitorAge:
		c.Status, c.Error = StatusFail, fmt.Sprintf("janitor's last successful pass was over %s ago", h.config.MaxJanitorAge)
	}
	return c
}

func response(checks map[string]Check) Response {
	status := StatusOK
	for _, c := range checks {
		if c.Status != StatusOK {
			status = StatusFail
		}
	}
	return Response{Status: status, Checks: checks}
}

func (h *Handler) write(w http.ResponseWriter, r Response) {
	code := http.StatusOK
	if r.Status != StatusOK {
		code = http.StatusServiceUnavailable
		h.logger.Info("Health check failed", watermill.LogFields{"checks": r.Checks})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(r)
}
