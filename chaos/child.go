package chaos

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// specEnv carries a child process's spec (JSON). Its presence makes the
// binary a child: see IsChild.
const specEnv = "WATERMILL_IDEMPOTENT_CHAOS_SPEC"

// exitAfterCommitCode is the exit status of a worker that exits on
// purpose after the inbox committed and before the broker saw the ack;
// the supervisor counts it as that fault.
const exitAfterCommitCode = 97

// Child roles.
const (
	roleWorker = "worker"
	roleRelay  = "relay"
)

// spec is what the orchestrator tells a child process.
type spec struct {
	Role, Name, Mode string
	Names            names
	DSN              string  // the private cluster (inbox, outbox, transactional ledger)
	LedgerPath       string  // the two-phase effects ledger: a SQLite file, never faulted
	AMQPURL          string  //
	ExitAfterCommit  float64 // probability per processed delivery
	Lease            time.Duration
	Policy           idempotency.ExpiredLeasePolicy // two-phase
	EffectDelay      time.Duration                  // two-phase: up to this long before and after the effect
	Batch            int                            // transactional: group commit's MaxMessages, 0 when off
	// Partitioned puts the inbox on postgres.PartitionedRepository, with
	// records kept for Retention (RunSurfaces).
	Partitioned bool
	Retention   time.Duration
	// Surface is a RunSurfaces caller or server (roleCaller, roleServer).
	Surface *surfaceSpec
}

// IsChild reports whether this process was started by the suite as a
// worker or relay (the re-exec pattern: one binary, roles by environment).
func IsChild() bool { return os.Getenv(specEnv) != "" }

// RunChild runs the role named in the environment until SIGTERM or
// SIGINT, then shuts down gracefully. It returns the exit status.
func RunChild() int {
	var s spec
	if err := json.Unmarshal([]byte(os.Getenv(specEnv)), &s); err != nil {
		fmt.Fprintf(os.Stderr, "chaos child: bad spec: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := watermill.NewStdLogger(false, false).With(watermill.LogFields{"process": s.Name, "pid": os.Getpid()})
	var err error
	switch s.Role {
	case roleWorker:
		err = runWorker(ctx, s, logger)
	case roleRelay:
		err = runRelay(ctx, s, logger)
	case roleCaller:
		err = runCaller(ctx, s, logger)
	case roleServer:
		err = runServer(ctx, s, logger)
	default:
		err = fmt.Errorf("unknown role %q", s.Role)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "chaos %s: %v\n", s.Name, err)
		return 1
	}
	return 0
}

// openDB opens a pool of at most maxConns connections to dsn, the way a
// user does: sql.Open with pgx's driver. (The library's stores take
// care that their calls' deadlines do not cut connects short: see
// sqlexec.Std.)
func openDB(dsn string, maxConns int) (*sql.DB, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(maxConns)
	return db, nil
}

// amqpConfig is watermill-amqp's durable pub/sub with publisher confirms;
// the queue of a topic is topic+"_workers", shared by every worker, so
// they compete for its messages. declareTopology declares the same names.
func amqpConfig(url string) amqp.Config {
	c := amqp.NewDurablePubSubConfig(url, queueName)
	c.Publish.ConfirmDelivery = true
	return c
}

func queueName(topic string) string { return topic + "_workers" }

// ranKey marks, in a delivery's context, that the handler itself ran (a
// fresh claim, not a duplicate answered by the inbox).
type ranKey struct{}

func markRan(ctx context.Context) {
	if ran, ok := ctx.Value(ranKey{}).(*bool); ok {
		*ran = true
	}
}

// exitAfterCommit is placed outside the inbox: when the inner handler ran
// and the inbox returned success (its transaction, or the two-phase
// Complete, committed) it exits the process with probability p, before the
// router acks. The broker then redelivers a message whose effect is
// already recorded.
func exitAfterCommit(p float64) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ran := new(bool)
			msg.SetContext(context.WithValue(msg.Context(), ranKey{}, ran))
			out, err := next(msg)
			if err == nil && *ran && rand.Float64() < p {
				os.Exit(exitAfterCommitCode)
			}
			return out, err
		}
	}
}

// order is the producer's message payload.
type order struct {
	OrderID string `json:"order_id"`
	Amount  int    `json:"amount"`
}

func runWorker(ctx context.Context, s spec, logger watermill.LoggerAdapter) error {
	db, err := openDB(s.DSN, 8+2*s.Batch)
	if err != nil {
		return err
	}
	defer db.Close()
	sub, err := amqp.NewSubscriber(amqpConfig(s.AMQPURL), logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	pub, err := amqp.NewPublisher(amqpConfig(s.AMQPURL), logger)
	if err != nil {
		return err
	}
	defer pub.Close()

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 20 * time.Second}, logger)
	if err != nil {
		return err
	}
	// Permanent inbox errors go to the poison queue (the orchestrator
	// counts them); transient ones are retried with backoff in process,
	// then nacked for the broker to redeliver.
	poison, err := wmiddleware.PoisonQueueWithFilter(pub, s.Names.Poison, idempotency.IsPermanent)
	if err != nil {
		return err
	}
	retry := wmiddleware.Retry{
		MaxRetries: 6, InitialInterval: 50 * time.Millisecond, MaxInterval: time.Second, Multiplier: 2,
		ShouldRetry: func(p wmiddleware.RetryParams) bool { return !idempotency.IsPermanent(p.Err) },
	}
	exit := exitAfterCommit(s.ExitAfterCommit)

	switch s.Mode {
	case Transactional:
		repo, err := inboxRepository(db, s)
		if err != nil {
			return err
		}
		ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: s.Names.Outbox})
		if err != nil {
			return err
		}
		// Each inbox's scope is its handler's, mapped by HandlerScopes
		// ("billing", "receipts"), or "chaos/effects". With group commit, Batch handlers
		// ("billing-1", …) consume each queue under one scope, so that
		// one inbox sees Batch deliveries at once.
		copies, batch := 1, middleware.BatchConfig{}
		if s.Batch > 1 {
			// A wait long enough for batches to form at the producer's
			// pace.
			copies, batch = s.Batch, middleware.BatchConfig{MaxMessages: s.Batch, MaxWait: 20 * time.Millisecond}
		}
		name := func(base string, i int) string {
			if copies == 1 {
				return base
			}
			return fmt.Sprintf("%s-%d", base, i+1)
		}
		scopes := map[string]string{}
		for i := range copies {
			scopes[name("billing", i)], scopes[name("receipts", i)] = "billing", "receipts"
		}
		shared := &sharing{logger: logger, txs: map[*sql.Tx]int{}}
		billing, err := middleware.NewInbox(repo, middleware.Config{Consumer: "chaos", Logger: logger, HandlerScopes: scopes, Batch: batch,
			Outputs: ob.Outputs(s.Names.Payments), Retention: s.Retention, RedeliveryWindow: s.Retention,
		})
		if err != nil {
			return err
		}
		receipts, err := middleware.NewInbox(repo, middleware.Config{Consumer: "chaos", Logger: logger, HandlerScopes: scopes, Batch: batch, Retention: s.Retention, RedeliveryWindow: s.Retention})
		if err != nil {
			return err
		}
		for i := range copies {
			h := router.AddHandler(name("billing", i), s.Names.Orders, sub, s.Names.Payments, pub, billingHandler(s, shared))
			h.AddMiddleware(poison, retry.Middleware, exit, billing.Middleware)
			r := router.AddConsumerHandler(name("receipts", i), s.Names.Payments, sub, receiptsHandler(s))
			r.AddMiddleware(poison, retry.Middleware, exit, receipts.Middleware)
		}
	case TwoPhase:
		ledger, err := sqlite.Open(s.LedgerPath)
		if err != nil {
			return err
		}
		defer ledger.Close()
		repo, err := postgres.NewRepository(db, postgres.Config{Table: s.Names.Inbox})
		if err != nil {
			return err
		}
		inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{
			Repository: repo, Consumer: "chaos", Lease: s.Lease, OnExpiredLease: s.Policy, Logger: logger,
		})
		if err != nil {
			return err
		}
		h := router.AddConsumerHandler("effects", s.Names.Orders, sub, effectHandler(s, ledger))
		h.AddMiddleware(poison, retry.Middleware, exit, inbox.Middleware)
	default:
		return fmt.Errorf("unknown mode %q", s.Mode)
	}
	return router.Run(ctx)
}

// billingHandler records the order's effect in the ledger table through
// the inbox transaction and returns a payment, which the inbox writes to
// the outbox in the same transaction.
func billingHandler(s spec, shared *sharing) message.HandlerFunc {
	insert := `INSERT INTO ` + s.Names.Effects + ` (order_id, process) VALUES ($1, $2)`
	return func(msg *message.Message) ([]*message.Message, error) {
		markRan(msg.Context())
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return nil, err
		}
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return nil, fmt.Errorf("billing: %w", err)
		}
		if _, err := tx.ExecContext(msg.Context(), insert, o.OrderID, s.Name); err != nil {
			return nil, err
		}
		shared.saw(tx)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	}
}

// receiptsHandler records a payment's arrival downstream of the relay.
func receiptsHandler(s spec) message.NoPublishHandlerFunc {
	insert := `INSERT INTO ` + s.Names.Receipts + ` (order_id, process) VALUES ($1, $2)`
	return func(msg *message.Message) error {
		markRan(msg.Context())
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return err
		}
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return fmt.Errorf("receipts: %w", err)
		}
		_, err = tx.ExecContext(msg.Context(), insert, o.OrderID, s.Name)
		return err
	}
}

// effectHandler is the two-phase effect: an insert into a ledger in
// another database (a SQLite file, which no fault touches and whose
// commit a killed process cannot leave in doubt), with a pause before and
// after it so that SIGKILLs land during the effect.
func effectHandler(s spec, ledger *sql.DB) message.NoPublishHandlerFunc {
	insert := `INSERT INTO ` + s.Names.Effects + ` (order_id, process) VALUES (?, ?)`
	return func(msg *message.Message) error {
		markRan(msg.Context())
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return err
		}
		pause(msg.Context(), s.EffectDelay)
		// The effect is not cancelled with the delivery: a half-sent
		// insert would make its outcome unknown to the handler.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 10*time.Second)
		_, err := ledger.ExecContext(ctx, insert, o.OrderID, s.Name)
		cancel()
		if err != nil {
			return err
		}
		pause(msg.Context(), s.EffectDelay)
		return nil
	}
}

func pause(ctx context.Context, upTo time.Duration) {
	if upTo <= 0 {
		return
	}
	t := time.NewTimer(rand.N(upTo))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func runRelay(ctx context.Context, s spec, logger watermill.LoggerAdapter) error {
	db, err := openDB(s.DSN, 4)
	if err != nil {
		return err
	}
	defer db.Close()
	pub, err := amqp.NewPublisher(amqpConfig(s.AMQPURL), logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{
		Dialect: sqldialect.PostgreSQL, Table: s.Names.Outbox, RetryInterval: 200 * time.Millisecond, BatchSize: 100,
		Notifier: pgxoutbox.Notifier(db),
		Logger:   logger,
	})
	if err != nil {
		return err
	}
	err = relay.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// sharing counts the billing runs that shared their transaction with
// another delivery (group commit), and logs the tally every 50 runs, so
// that the logs show whether batches formed.
type sharing struct {
	logger       watermill.LoggerAdapter
	mu           sync.Mutex
	txs          map[*sql.Tx]int
	runs, shared int
}

func (s *sharing) saw(tx *sql.Tx) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.txs[tx]++
	s.runs++
	switch n := s.txs[tx]; {
	case n == 2:
		s.shared += 2
	case n > 2:
		s.shared++
	}
	if s.runs%50 == 0 {
		s.logger.Info("billing runs in shared transactions", watermill.LogFields{"runs": s.runs, "shared": s.shared, "transactions": len(s.txs)})
	}
}
