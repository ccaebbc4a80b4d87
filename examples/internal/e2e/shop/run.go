package shop

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/watermill-idempotent/examples/internal/e2e/broker"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Defaults of Config.
const (
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultOrders      = 40
	DefaultInstances   = 2
)

// Config configures Run.
type Config struct {
	// Broker selects and addresses the broker. Required.
	Broker broker.Config
	// Database is where the inbox, the outbox and the ledger live.
	// Default: Postgres.
	Database Database
	// PostgresDSN addresses PostgreSQL (pgx). Default: DefaultPostgresDSN.
	PostgresDSN string
	// SQLitePath is the SQLite file. Default: a file in a temporary
	// directory removed at the end.
	SQLitePath string
	// Orders is how many orders the producer places. Default:
	// DefaultOrders; at least 20, so every kind of fault is injected.
	Orders int
	// Instances is how many billing instances compete for the orders.
	// Default: DefaultInstances.
	Instances int
	// Run names this run's tables, topics, queues and consumer groups, so
	// runs sharing servers never collide. Default: random.
	Run string
	// Observer also receives every inbox outcome (for example the metrics
	// package's Prometheus observer). Default: nil.
	Observer idempotency.Observer
	// RelayObserver receives the outbox relay's batches and backlog
	// samples, under the relay name "payments" (for example
	// metrics.Metrics). Default: nil.
	RelayObserver outbox.RelayObserver
	// RelayStarted, if set, is called with the database and the relay
	// once the relay is created, before it runs (for health probes).
	// Default: nil.
	RelayStarted func(db *sql.DB, relay *outbox.Relay)
	// Logger receives Watermill's logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Keep leaves the run's tables, topics and queues in place for
	// inspection. Default: false (everything is deleted at the end).
	Keep bool
}

func (c *Config) setDefaults() {
	if c.Database == "" {
		c.Database = Postgres
	}
	if c.PostgresDSN == "" {
		c.PostgresDSN = DefaultPostgresDSN
	}
	if c.Orders == 0 {
		c.Orders = DefaultOrders
	}
	if c.Instances == 0 {
		c.Instances = DefaultInstances
	}
	if c.Run == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Run = "r" + hex.EncodeToString(b[:])
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate reports whether the configuration is usable.
func (c Config) Validate() error {
	var errs []error
	if c.Database != Postgres && c.Database != SQLite {
		errs = append(errs, fmt.Errorf("unknown database %q: want postgres or sqlite", c.Database))
	}
	if c.Orders < 20 {
		errs = append(errs, errors.New("at least 20 orders are needed"))
	}
	if c.Instances < 1 {
		errs = append(errs, errors.New("at least 1 billing instance is needed"))
	}
	return errors.Join(errs...)
}

// Faults says what goes wrong for which order. The choice depends on the
// order's position only, so every run injects the same faults.
type Faults struct {
	Resent          map[string]bool // the producer loses the confirmation and publishes again
	FailOnce        map[string]bool // the first charge attempt fails and rolls back
	CrashBeforeAck  map[string]bool // the instance dies after the commit, before the ack
	MismatchOfOrder string          // its UUID is re-published with other content
}

// FaultsFor returns the faults injected into orders: a quarter of them
// re-sent by the producer, a tenth failing once, and one in twenty (at
// least two) crashing its instance after the commit and before the ack.
func FaultsFor(orders []OrderPlaced) Faults {
	f := Faults{Resent: map[string]bool{}, FailOnce: map[string]bool{}, CrashBeforeAck: map[string]bool{}}
	for i, o := range orders {
		switch {
		case i%20 == 7:
			f.CrashBeforeAck[o.OrderID] = true
		case i%4 == 1:
			f.Resent[o.OrderID] = true
		}
		if i%10 == 3 {
			f.FailOnce[o.OrderID] = true
		}
	}
	f.MismatchOfOrder = orders[0].OrderID
	return f
}

var customers = []string{"alice", "bob", "carol", "dave"}

// NewOrders returns n orders with stable IDs, customers and amounts.
func NewOrders(n int) []OrderPlaced {
	orders := make([]OrderPlaced, n)
	for i := range orders {
		orders[i] = OrderPlaced{
			OrderID:  fmt.Sprintf("order-%03d", i+1),
			Customer: customers[i%len(customers)],
			Amount:   100 + (i*1373)%9000,
		}
	}
	return orders
}

// Topics are a run's topic names.
type Topics struct {
	Orders, Payments, Poison string
}

// TopicsFor returns the topic names of run.
func TopicsFor(run string) Topics {
	return Topics{Orders: "shop_orders_" + run, Payments: "shop_payments_" + run, Poison: "shop_orders_poison_" + run}
}

// Run plays the scenario on the configured broker and database: Instances
// billing instances compete for the orders, the producer re-sends some,
// some charges fail once, some instances crash after committing and
// before acking, two deliberately bad messages (one without a key, one
// reusing a key for other content) are published, and a receipts service
// consumes the payments. It returns when every order is charged, every
// payment has a receipt and both bad messages reached the poison queue,
// or when ctx ends.
func Run(ctx context.Context, config Config) (*Ledger, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("shop: %w", err)
	}
	start := time.Now()

	db, cleanupDB, err := openDatabase(config)
	if err != nil {
		return nil, err
	}
	defer cleanupDB()
	store, err := NewStore(ctx, db, config.Database, config.Run)
	if err != nil {
		return nil, err
	}
	if !config.Keep {
		defer func() { _ = store.Drop(context.WithoutCancel(ctx)) }()
	}

	b, err := broker.Open(config.Broker, config.Logger)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	topics := TopicsFor(config.Run)
	if err := b.CreateTopics(ctx, topics.Orders, topics.Payments, topics.Poison); err != nil {
		return nil, err
	}
	if !config.Keep {
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			_ = b.DeleteTopics(cctx, topics.Orders, topics.Payments, topics.Poison)
		}()
	}

	orders := NewOrders(config.Orders)
	s := &scenario{
		config:  config,
		store:   store,
		broker:  b,
		topics:  topics,
		orders:  orders,
		faults:  FaultsFor(orders),
		counter: newOutcomeCounter(config.Observer),
		failed:  map[string]bool{},
		crashed: map[string]bool{},
		downed:  map[message.Subscriber]bool{},
	}
	s.publisher = &countingPublisher{Publisher: b.Publisher(), topic: topics.Payments}
	s.ledger = &Ledger{
		Run: config.Run, Broker: string(b.Kind()), Database: string(config.Database),
		Instances: config.Instances, Orders: len(orders), ViaOutbox: store.Outbox != nil,
	}
	if err := s.play(ctx); err != nil {
		return s.ledger, err
	}
	s.ledger.Elapsed = time.Since(start)
	return s.ledger, nil
}

func openDatabase(config Config) (*sql.DB, func(), error) {
	switch config.Database {
	case Postgres:
		db, err := sql.Open("pgx", config.PostgresDSN)
		if err != nil {
			return nil, nil, fmt.Errorf("postgres: %w", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := db.PingContext(ctx); err != nil {
			_ = db.Close()
			return nil, nil, fmt.Errorf("postgres at %s: %w", config.PostgresDSN, err)
		}
		return db, func() { _ = db.Close() }, nil
	default:
		path, dir := config.SQLitePath, ""
		if path == "" {
			var err error
			if dir, err = os.MkdirTemp("", "shop-"); err != nil {
				return nil, nil, err
			}
			path = filepath.Join(dir, "shop.db")
		}
		db, err := sqlite.Open(path)
		if err != nil {
			if dir != "" {
				_ = os.RemoveAll(dir)
			}
			return nil, nil, fmt.Errorf("sqlite: %w", err)
		}
		return db, func() {
			_ = db.Close()
			if dir != "" {
				_ = os.RemoveAll(dir)
			}
		}, nil
	}
}

// scenario is one Run in progress.
type scenario struct {
	config    Config
	store     *Store
	broker    *broker.Broker
	publisher *countingPublisher
	topics    Topics
	orders    []OrderPlaced
	faults    Faults
	counter   *outcomeCounter
	ledger    *Ledger

	mu       sync.Mutex
	failed   map[string]bool             // orders whose injected failure happened
	crashed  map[string]bool             // orders whose injected crash happened
	downed   map[message.Subscriber]bool // instances a crash took down for good, by subscriber
	restarts int                         // replacements running
	poisoned []string                    // UUIDs seen on the poison topic

	poisonSeen   atomic.Int64
	receiptsSeen atomic.Int64 // payment deliveries the receipts inbox acknowledged
}

func (s *scenario) group(name string) string { return name + "-" + s.config.Run }

func (s *scenario) play(ctx context.Context) (err error) {
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, s.config.Instances+2)
	defer func() {
		stop()
		wg.Wait()
		close(errs)
		for e := range errs {
			if err == nil && e != nil && !errors.Is(e, context.Canceled) {
				err = e
			}
		}
	}()

	// Downstream first, so the payments and poison topics have their
	// queues before anything is published to them.
	downstream, err := s.downstreamRouter()
	if err != nil {
		return err
	}
	if err := startRouter(runCtx, &wg, errs, downstream); err != nil {
		return err
	}

	for i := range s.config.Instances {
		running := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.superviseBilling(runCtx, fmt.Sprintf("billing-%d", i+1), running)
		}()
		select {
		case <-running:
		case e := <-errs:
			return e
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	if s.store.Outbox != nil {
		relay, err := outbox.NewRelay(s.store.DB, s.publisher, outbox.RelayConfig{
			Dialect: sqldialect.PostgreSQL, Table: s.store.Tables.Outbox, RetryInterval: 100 * time.Millisecond,
			Notifier: pgxoutbox.Notifier(s.store.DB),
			Name:     "payments",
			Observer: s.config.RelayObserver,
			Logger:   s.config.Logger,
		})
		if err != nil {
			return err
		}
		if s.config.RelayStarted != nil {
			s.config.RelayStarted(s.store.DB, relay)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- relay.Run(runCtx)
		}()
	}

	// The producer: every order once, a quarter of them twice.
	producer := &Producer{
		Publisher:        s.broker.Publisher(),
		Topic:            s.topics.Orders,
		ConfirmationLost: func(o OrderPlaced) bool { return s.faults.Resent[o.OrderID] },
	}
	uuids := map[string]string{}
	for _, o := range s.orders {
		uuid, copies, err := producer.Place(o)
		if err != nil {
			return err
		}
		uuids[o.OrderID] = uuid
		s.ledger.Published += copies
	}
	// A producer bug: a message without a deduplication key.
	noKey, _ := json.Marshal(OrderPlaced{OrderID: "order-nokey", Customer: "mallory", Amount: 1})
	if err := s.broker.Publisher().Publish(s.topics.Orders, message.NewMessage("", noKey)); err != nil {
		return err
	}
	s.ledger.Published++
	s.ledger.BadMessages++

	// Once every order is charged, another producer bug: order 1's UUID
	// reused for other content. (Published earlier, it could win the race
	// against the real order 1, which would then be the mismatch.)
	if err := s.waitUntil(ctx, "every order charged", func() bool {
		// The database, not the outcome counter, is the truth: a commit
		// interrupted by a dying instance may have gone through although
		// the inbox reported it failed (its redelivery is then a
		// duplicate).
		_, charged, _, err := s.store.Charged(ctx)
		return err == nil && charged == len(s.orders)
	}); err != nil {
		return err
	}
	first := s.orders[0]
	other, _ := json.Marshal(OrderPlaced{OrderID: first.OrderID, Customer: first.Customer, Amount: first.Amount * 100})
	if err := s.broker.Publisher().Publish(s.topics.Orders, message.NewMessage(uuids[s.faults.MismatchOfOrder], other)); err != nil {
		return err
	}
	s.ledger.BadUUIDs = []string{"", uuids[s.faults.MismatchOfOrder]}
	s.ledger.Published++
	s.ledger.BadMessages++

	// Every condition is an effect that has happened, not a guess at
	// timing: stopping earlier cuts off work in flight and the ledger
	// would count a state no run ends in.
	// Every publish is delivered, and redelivered once per crash and once
	// per failed delivery: the injected failures, and deliveries a crash
	// interrupted (a closing subscriber can hand over one more message and
	// then cancel it), whose redelivery may come only after the broker's
	// redelivery timer.
	minDeliveries := func() int {
		billing := s.counter.snapshot("billing")
		return s.ledger.Published + len(s.faults.CrashBeforeAck) + max(billing[idempotency.OutcomeFailed], len(s.faults.FailOnce))
	}
	if err := s.waitUntil(ctx, "the flow to settle", func() bool {
		if s.counter.total("billing") < minDeliveries() ||
			s.receiptsSeen.Load() < s.publisher.count.Load() ||
			s.poisonSeen.Load() < int64(s.ledger.BadMessages) {
			return false
		}
		// Each instance a crash took down has its replacement running; a
		// stop before that would leave the crashed one uncounted.
		s.mu.Lock()
		replaced := s.restarts >= len(s.downed)
		s.mu.Unlock()
		if !replaced {
			return false
		}
		// The relay deletes a batch's rows after publishing it: a receipt
		// can arrive before that delete commits, and stopping then would
		// abandon the batch with its rows still in the outbox.
		if backlog, err := s.store.OutboxBacklog(ctx); err != nil || backlog != 0 {
			return false
		}
		_, orders, err := s.store.Receipts(ctx)
		return err == nil && orders == len(s.orders)
	}); err != nil {
		return err
	}

	// Stop everything, then read the ledger.
	stop()
	wg.Wait()
	return s.fillLedger(ctx)
}

func (s *scenario) waitUntil(ctx context.Context, what string, cond func() bool) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			backlog, _ := s.store.OutboxBacklog(context.WithoutCancel(ctx))
			return fmt.Errorf("waiting for %s: %w (billing outcomes %v, receipts outcomes %v, poisoned %d, outbox backlog %d)",
				what, ctx.Err(), s.counter.snapshot("billing"), s.counter.snapshot("receipts"), s.poisonSeen.Load(), backlog)
		case <-t.C:
		}
	}
	return nil
}

func startRouter(ctx context.Context, wg *sync.WaitGroup, errs chan<- error, r *message.Router) error {
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- r.Run(ctx)
	}()
	select {
	case <-r.Running():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newInbox returns an inbox for one handler; its keys are scoped by the
// service's and the handler's name ("shop/billing", "shop/receipts"), the
// consumer label of its metrics.
func (s *scenario) newInbox(outputs middleware.OutputWriter) (*middleware.Inbox, error) {
	return middleware.NewInbox(s.store.Inbox, middleware.Config{
		Consumer:         "shop",
		RedeliveryWindow: 24 * time.Hour,
		Logger:           s.config.Logger,
		Observer:         s.counter,
		Outputs:          outputs,
	})
}

// downstreamRouter runs the receipts service and the poison-queue audit.
func (s *scenario) downstreamRouter() (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{}, s.config.Logger)
	if err != nil {
		return nil, err
	}
	inbox, err := s.newInbox(nil)
	if err != nil {
		return nil, err
	}
	receiptsSub, err := s.broker.NewSubscriber(s.group("receipts"))
	if err != nil {
		return nil, err
	}
	receipts := &Receipts{Store: s.store}
	h := router.AddConsumerHandler("receipts", s.topics.Payments, receiptsSub, receipts.Handle)
	h.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err == nil {
				s.receiptsSeen.Add(1)
			}
			return out, err
		}
	}, inbox.Middleware)

	auditSub, err := s.broker.NewSubscriber(s.group("audit"))
	if err != nil {
		return nil, err
	}
	router.AddConsumerHandler("poison-audit", s.topics.Poison, auditSub, func(msg *message.Message) error {
		s.mu.Lock()
		s.poisoned = append(s.poisoned, msg.UUID)
		s.mu.Unlock()
		s.poisonSeen.Add(1)
		return nil
	})
	return router, nil
}

// superviseBilling keeps one billing instance running until ctx ends,
// starting a replacement when a crash took the instance down for good
// (Kafka), as an orchestrator restarts a dead process.
func (s *scenario) superviseBilling(ctx context.Context, name string, running chan<- struct{}) error {
	for generation := 0; ; generation++ {
		router, err := s.billingInstance(name)
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- router.Run(ctx) }()
		select {
		case <-router.Running():
			if generation == 0 {
				close(running)
			} else {
				s.mu.Lock()
				s.restarts++
				s.mu.Unlock()
			}
		case err := <-done:
			return fmt.Errorf("%s did not start: %w", name, err)
		}
		err = <-done
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
}

// billingInstance builds one billing service instance: its own subscriber
// (connection, group member) and router. The handler and the inbox are the
// same whichever broker runs.
func (s *scenario) billingInstance(name string) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{}, s.config.Logger.With(watermill.LogFields{"instance": name}))
	if err != nil {
		return nil, err
	}
	// On PostgreSQL the payment events are written to the outbox in the
	// inbox transaction and the relay publishes them; on SQLite the router
	// publishes them after the commit.
	var outputs middleware.OutputWriter
	if s.store.Outbox != nil {
		outputs = s.store.Outbox.Outputs(s.topics.Payments)
	}
	inbox, err := s.newInbox(outputs)
	if err != nil {
		return nil, err
	}
	sub, err := s.broker.NewSubscriber(s.group("billing"))
	if err != nil {
		return nil, err
	}
	// Permanent inbox errors (no key, key reused for other content) go to
	// the poison queue and are acknowledged; everything else is retried.
	poison, err := wmiddleware.PoisonQueueWithFilter(s.broker.Publisher(), s.topics.Poison, idempotency.IsPermanent)
	if err != nil {
		return nil, err
	}
	billing := &Billing{Store: s.store, FailOnce: s.failOnce}
	h := router.AddHandler("billing", s.topics.Orders, sub, s.topics.Payments, s.publisher, billing.Handle)
	h.AddMiddleware(poison, s.crashBeforeAck(sub), inbox.Middleware)
	return router, nil
}

func (s *scenario) failOnce(o OrderPlaced) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.faults.FailOnce[o.OrderID] || s.failed[o.OrderID] {
		return false
	}
	s.failed[o.OrderID] = true
	return true
}

// crashBeforeAck kills the instance holding sub after the inbox committed
// the first charge of a chosen order and before the broker saw the ack.
func (s *scenario) crashBeforeAck(sub message.Subscriber) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx, ran := withRanFlag(msg.Context())
			orig := msg.Context()
			msg.SetContext(ctx)
			out, err := next(msg)
			msg.SetContext(orig)
			if err != nil || !*ran {
				return out, err
			}
			var o OrderPlaced
			if json.Unmarshal(msg.Payload, &o) != nil {
				return out, nil
			}
			s.mu.Lock()
			crash := s.faults.CrashBeforeAck[o.OrderID] && !s.crashed[o.OrderID]
			if crash {
				s.crashed[o.OrderID] = true
			}
			s.mu.Unlock()
			if !crash {
				return out, nil
			}
			survives, err := broker.Crash(sub)
			if err != nil {
				return nil, err
			}
			if !survives {
				// Two crash orders in flight in one instance at once (Kafka
				// delivers partitions concurrently) take it down once.
				s.mu.Lock()
				s.downed[sub] = true
				s.mu.Unlock()
			}
			return nil, fmt.Errorf("instance crashed after committing %s, before its ack", o.OrderID)
		}
	}
}

func (s *scenario) fillLedger(ctx context.Context) error {
	l := s.ledger
	l.Billing = s.counter.snapshot("billing")
	l.Receipts = s.counter.snapshot("receipts")
	s.mu.Lock()
	l.Failures = len(s.failed)
	l.Crashes = len(s.crashed)
	l.Restarts = s.restarts
	l.InstancesDown = len(s.downed)
	l.Poisoned = append([]string(nil), s.poisoned...)
	s.mu.Unlock()
	l.PaymentsPublished = int(s.publisher.count.Load())
	l.PaymentsDelivered = int(s.receiptsSeen.Load())

	want := map[string]CustomerTotals{}
	for _, o := range s.orders {
		t := want[o.Customer]
		t.Charges++
		t.Cents += o.Amount
		want[o.Customer] = t
	}
	l.Expected = want
	var err error
	if l.Charged, l.ChargedOrders, l.DoubleCharged, err = s.store.Charged(ctx); err != nil {
		return err
	}
	if l.ReceiptRows, l.ReceiptOrders, err = s.store.Receipts(ctx); err != nil {
		return err
	}
	l.OutboxBacklog, err = s.store.OutboxBacklog(ctx)
	return err
}

// countingPublisher counts the messages published to one topic.
type countingPublisher struct {
	message.Publisher
	topic string
	count atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	if err == nil && topic == p.topic {
		p.count.Add(int64(len(msgs)))
	}
	return err
}
