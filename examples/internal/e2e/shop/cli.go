package shop

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/health"
	"github.com/idemkit/watermill-idempotent/metrics"
	"github.com/idemkit/watermill-idempotent/outbox"
)

// Environment variables read by CLI for the database.
const (
	DatabaseEnv    = "DATABASE"
	PostgresDSNEnv = "POSTGRES_DSN"
)

// CLI is the command line of the harness (examples/internal/e2e).
type CLI struct {
	Config      Config
	MetricsAddr string
	Timeout     time.Duration
	debug       bool
}

// NewCLI returns the command line of a harness whose broker defaults to
// kind, with defaults from the environment (BROKER, AMQP_URL, NATS_URL,
// REDIS_ADDR, SQL_DSN, KAFKA_BROKERS, DATABASE, POSTGRES_DSN), and defines
// its flags on fs.
func NewCLI(fs *flag.FlagSet, kind broker.Kind) *CLI {
	c := &CLI{}
	c.Config.Broker = broker.ConfigFromEnv(broker.Config{Kind: kind})
	c.Config.Broker.RegisterFlags(fs)
	c.Config.Database = Database(getenv(DatabaseEnv, string(Postgres)))
	c.Config.PostgresDSN = getenv(PostgresDSNEnv, DefaultPostgresDSN)
	fs.Func("db", fmt.Sprintf("inbox database: postgres or sqlite (env %s; default %q)", DatabaseEnv, c.Config.Database), func(s string) error {
		c.Config.Database = Database(s)
		return nil
	})
	fs.StringVar(&c.Config.PostgresDSN, "postgres-dsn", c.Config.PostgresDSN, "PostgreSQL DSN (env "+PostgresDSNEnv+")")
	fs.StringVar(&c.Config.SQLitePath, "sqlite", "", "SQLite file with -db=sqlite (default: a temporary file)")
	fs.IntVar(&c.Config.Orders, "orders", DefaultOrders, "orders to place (at least 20)")
	fs.IntVar(&c.Config.Instances, "instances", DefaultInstances, "competing billing instances")
	fs.BoolVar(&c.Config.Keep, "keep", false, "keep the run's tables, topics and queues")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address (e.g. :9090) and keep serving after the summary until interrupted")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.BoolVar(&c.debug, "debug", false, "print Watermill's debug logs")
	return c
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Logger returns the Watermill logger the flags ask for.
func (c *CLI) Logger() watermill.LoggerAdapter {
	if c.debug {
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NopLogger{}
}

// MetricsServer serves the library's Prometheus metrics, registered on a
// registry of its own, over HTTP at /metrics, and the health probes at
// /healthz (liveness) and /readyz (readiness) once SetHealth is called
// (503 before).
type MetricsServer struct {
	Metrics  *metrics.Metrics
	Registry *prometheus.Registry
	Addr     string // the address it listens on

	health atomic.Pointer[health.Handler]
	server *http.Server
	done   chan error
}

// SetHealth makes /healthz and /readyz answer with h's probes.
func (s *MetricsServer) SetHealth(h *health.Handler) { s.health.Store(h) }

func (s *MetricsServer) probe(live bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := s.health.Load()
		switch {
		case h == nil:
			http.Error(w, `{"status":"fail","checks":{}}`, http.StatusServiceUnavailable)
		case live:
			h.Liveness().ServeHTTP(w, r)
		default:
			h.Readiness().ServeHTTP(w, r)
		}
	})
}

// StartMetrics listens on addr and serves /metrics until Close.
func StartMetrics(addr string) (*MetricsServer, error) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(metrics.Config{Registerer: reg})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &MetricsServer{
		Metrics: m, Registry: reg, Addr: ln.Addr().String(),
		server: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second},
		done:   make(chan error, 1),
	}
	mux.Handle("/healthz", s.probe(true))
	mux.Handle("/readyz", s.probe(false))
	go func() { s.done <- s.server.Serve(ln) }()
	return s, nil
}

// Close stops the server and waits until it has.
func (s *MetricsServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.server.Shutdown(ctx)
	if serveErr := <-s.done; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err
}

// Run plays the scenario as the flags say, prints the ledger to w and,
// with -metrics-addr, keeps serving /metrics until interrupted. It returns
// an error if the run failed or the ledger does not show exactly-once
// effects.
func (c *CLI) Run(w io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	runCtx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()

	config := c.Config
	config.Logger = c.Logger()
	var ms *MetricsServer
	if c.MetricsAddr != "" {
		var err error
		if ms, err = StartMetrics(c.MetricsAddr); err != nil {
			return err
		}
		defer ms.Close()
		config.Observer = ms.Metrics
		config.RelayObserver = ms.Metrics
		config.RelayStarted = func(db *sql.DB, relay *outbox.Relay) {
			if h, err := health.NewHandler(health.Config{DB: db, Relay: relay, Logger: config.Logger}); err == nil {
				ms.SetHealth(h)
			}
		}
		fmt.Fprintf(w, "serving metrics on http://%s/metrics\n\n", ms.Addr)
	}
	ledger, err := Run(runCtx, config)
	if err != nil {
		return err
	}
	ledger.Print(w)
	if !ledger.ExactlyOnce() {
		return errors.New("the ledger does not show exactly-once effects")
	}
	if ms != nil {
		fmt.Fprintf(w, "\nstill serving http://%s/metrics; interrupt (Ctrl-C) to exit\n", ms.Addr)
		<-ctx.Done()
	}
	return nil
}
