package chaos

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// Modes of the inbox a phase runs.
const (
	Transactional = "transactional"
	TwoPhase      = "two-phase"
)

// ErrPrerequisite means a service or tool the suite needs is missing
// (RabbitMQ, postgresql-common). The command skips on it, or fails under
// CI=true.
var ErrPrerequisite = errors.New("chaos: prerequisite missing")

// Environment variables read by Config's defaults.
const (
	PortEnv    = "CHAOS_PG_PORT"    // private cluster port; default DefaultPort
	VersionEnv = "CHAOS_PG_VERSION" // PostgreSQL major version; default: the newest in /usr/lib/postgresql
	AMQPEnv    = "AMQP_URL"         // RabbitMQ; default amqp://guest:guest@127.0.0.1:5672/
)

// Defaults.
const (
	// DefaultPort is the private cluster's port. Not 5433: that is the
	// first port anyone else picks for a second cluster.
	DefaultPort        = 5437
	DefaultClusterName = "chaos"
	DefaultWorkers     = 3
)

// Config is one run of the suite: a transactional phase, then a
// two-phase phase, each with its own tables, queues and fault schedule.
type Config struct {
	// Orders is how many orders the transactional phase publishes.
	Orders int
	// TwoPhaseOrders is how many orders the two-phase phase publishes; 0
	// skips the phase.
	TwoPhaseOrders int
	// Workers is how many consumer processes compete on each queue.
	// Default: DefaultWorkers.
	Workers int
	// Duration is how long the producer takes to publish the
	// transactional phase's orders, so that the faults fall mid-stream;
	// TwoPhaseDuration likewise.
	Duration, TwoPhaseDuration time.Duration
	// FaultEvery is the mean pause between two injected faults (each pause
	// is drawn uniformly from half to one and a half of it);
	// TwoPhaseFaultEvery likewise.
	FaultEvery, TwoPhaseFaultEvery time.Duration
	// ExitAfterCommit is the probability that a worker exits right after
	// the inbox committed a fresh delivery, before the ack.
	ExitAfterCommit float64
	// Duplicates is the fraction of orders the producer publishes twice
	// (same UUID, same payload): half at once, half later in the stream.
	Duplicates float64
	// TwoPhasePolicy is the two-phase phase's policy for expired leases.
	// Default: idempotency.Intervene, which must show 0 doubled. Reclaim
	// re-runs effects by design: a run with it shows that the ledger sees
	// doubles, and must show 0 lost.
	TwoPhasePolicy idempotency.ExpiredLeasePolicy
	// Lease is the two-phase lease. Default: 2 s.
	Lease time.Duration
	// EffectDelay is the longest pause before and after the two-phase
	// effect. Default: 25 ms.
	EffectDelay time.Duration
	// Batch, above 1, runs the transactional phase with group commit
	// (middleware.Config.Batch): each worker consumes each queue with
	// Batch router handlers sharing one scope and one inbox, whose
	// concurrent deliveries commit together, at most Batch at a time.
	// Default: 0 (one handler per queue, no group commit).
	Batch int
	// Timeout bounds each phase, drain included.
	Timeout time.Duration

	// PGVersion, PGCluster and PGPort name the private cluster.
	PGVersion, PGCluster string
	PGPort               int
	// AMQPURL addresses RabbitMQ.
	AMQPURL string
	// Keep leaves tables and queues in place for inspection.
	Keep bool
	// Out receives progress and the fault table. Default: os.Stdout.
	Out io.Writer
	// LogDir receives one log file per child process and the two-phase
	// ledger (a SQLite file). Default: a new directory under os.TempDir().
	LogDir string
}

// CI is the configuration .ci/run uses: a few hundred orders and every
// kind of fault at least once, under two minutes on two cores.
func CI() Config {
	return Config{
		Orders: 300, TwoPhaseOrders: 150,
		Duration: 24 * time.Second, TwoPhaseDuration: 12 * time.Second,
		FaultEvery: 1500 * time.Millisecond, TwoPhaseFaultEvery: time.Second,
		ExitAfterCommit: 0.02, Duplicates: 0.2,
		Timeout: 3 * time.Minute,
	}
}

// Full is the configuration of make chaos: thousands of orders and
// hundreds of faults over several minutes.
func Full() Config {
	return Config{
		Orders: 5000, TwoPhaseOrders: 2000,
		Duration: 3 * time.Minute, TwoPhaseDuration: 90 * time.Second,
		FaultEvery: 1500 * time.Millisecond, TwoPhaseFaultEvery: 800 * time.Millisecond,
		ExitAfterCommit: 0.01, Duplicates: 0.2,
		Timeout: 15 * time.Minute,
	}
}

func (c *Config) setDefaults() {
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Lease == 0 {
		c.Lease = 2 * time.Second
	}
	if c.EffectDelay == 0 {
		c.EffectDelay = 25 * time.Millisecond
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.PGCluster == "" {
		c.PGCluster = DefaultClusterName
	}
	if c.PGPort == 0 {
		c.PGPort = DefaultPort
		if p, err := strconv.Atoi(os.Getenv(PortEnv)); err == nil {
			c.PGPort = p
		}
	}
	if c.PGVersion == "" {
		c.PGVersion = os.Getenv(VersionEnv)
		if c.PGVersion == "" {
			c.PGVersion = newestPostgres()
		}
	}
	if c.AMQPURL == "" {
		c.AMQPURL = getenv(AMQPEnv, "amqp://guest:guest@127.0.0.1:5672/")
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.Orders < 1 {
		errs = append(errs, errors.New("chaos: Orders must be positive"))
	}
	if c.TwoPhaseOrders < 0 {
		errs = append(errs, errors.New("chaos: TwoPhaseOrders must not be negative"))
	}
	if c.Workers < 2 {
		errs = append(errs, errors.New("chaos: at least 2 workers are needed to compete"))
	}
	if c.FaultEvery <= 0 || (c.TwoPhaseOrders > 0 && c.TwoPhaseFaultEvery <= 0) {
		errs = append(errs, errors.New("chaos: FaultEvery and TwoPhaseFaultEvery must be positive"))
	}
	if c.ExitAfterCommit < 0 || c.ExitAfterCommit > 1 || c.Duplicates < 0 || c.Duplicates > 1 {
		errs = append(errs, errors.New("chaos: ExitAfterCommit and Duplicates are fractions in [0, 1]"))
	}
	if c.TwoPhasePolicy != idempotency.Intervene && c.TwoPhasePolicy != idempotency.Reclaim {
		errs = append(errs, fmt.Errorf("chaos: unknown two-phase policy %s", c.TwoPhasePolicy))
	}
	if c.Batch < 0 || c.Batch > middleware.MaxBatchMessages {
		errs = append(errs, fmt.Errorf("chaos: Batch must be between 0 and %d", middleware.MaxBatchMessages))
	}
	if c.PGPort == sharedPort || c.PGCluster == "main" {
		errs = append(errs, fmt.Errorf("chaos: the private cluster must not be the shared one (main, port %d)", sharedPort))
	}
	if c.PGVersion == "" {
		errs = append(errs, fmt.Errorf("%w: no PostgreSQL server under /usr/lib/postgresql (set %s)", ErrPrerequisite, VersionEnv))
	}
	return errors.Join(errs...)
}

func newestPostgres() string {
	entries, err := os.ReadDir("/usr/lib/postgresql")
	if err != nil {
		return ""
	}
	best := 0
	for _, e := range entries {
		if v, err := strconv.Atoi(e.Name()); err == nil && v > best {
			if _, err := os.Stat("/usr/lib/postgresql/" + e.Name() + "/bin/postgres"); err == nil {
				best = v
			}
		}
	}
	if best == 0 {
		return ""
	}
	return strconv.Itoa(best)
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
