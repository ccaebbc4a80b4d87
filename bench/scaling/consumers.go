package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/bench/internal/brokers"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/bench/internal/proc"
	"github.com/idemkit/watermill-idempotent/bench/internal/stats"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// childArgs are a child process's settings.
type childArgs struct {
	queue, inbox, orders, outbox, app, brokers string
	workers, prefetch, batch                   int
	pgDSN, amqpURL                             string
}

// report is what a child prints on stdout when it stops.
type report struct {
	// LatenciesUS are the consumer's handler chain times in µs.
	LatenciesUS []int64 `json:"latencies_us,omitempty"`
	// Published are the relay's messages in publish order: sequence
	// number and publish time (UnixNano).
	Published [][2]int64 `json:"published,omitempty"`
}

// runConsumers is one consumer row: n processes on a queue of n·… messages.
func runConsumers(ctx context.Context, db *sql.DB, o options, n int) (runResult, error) {
	sfx := randomSuffix()
	inbox, orders, queue, app := "scale_inbox_"+sfx, "scale_orders_"+sfx, "scale_"+sfx, "scaling-"+sfx
	repo, err := postgres.NewRepository(db, postgres.Config{Table: inbox})
	if err != nil {
		return runResult{}, err
	}
	if err := repo.Migrate(ctx); err != nil {
		return runResult{}, err
	}
	defer func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + inbox + `, ` + orders) }()
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+orders+` (id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())`); err != nil {
		return runResult{}, err
	}
	args := []string{"-child", "consumer", "-queue", queue, "-inbox", inbox, "-orders", orders, "-app", app,
		"-workers", strconv.Itoa(o.workers), "-prefetch", strconv.Itoa(o.prefetch)}
	var broker []int // nil: RabbitMQ
	var pub message.Publisher
	handlers := n * o.workers
	if o.broker == "kafka" {
		kf, err := brokers.StartKfake(queue, o.partitions)
		if err != nil {
			return runResult{}, err
		}
		defer kf.Close()
		// -workers sizes the child's connection pool for its share of
		// the partitions once the group is balanced (a member that owns
		// more for a while queues for connections): all members at full
		// size would exceed max_connections (100) on a shared server.
		args = append(args, "-brokers", strings.Join(kf.ListenAddrs(), ","), "-workers", strconv.Itoa((o.partitions+n-1)/n))
		broker, handlers = []int{os.Getpid()}, o.partitions
		if pub, err = brokers.NewKafkaPublisher(kf.ListenAddrs()); err != nil {
			return runResult{}, err
		}
	} else {
		defer brokers.DeleteQueue(o.amqpURL, queue)
		if pub, err = brokers.NewAMQPPublisher(o.amqpURL, queue); err != nil {
			return runResult{}, err
		}
	}
	err = brokers.PublishAll(pub, queue, o.n)
	if err = errors.Join(err, pub.Close()); err != nil {
		return runResult{}, fmt.Errorf("publish: %w", err)
	}

	cs, err := startChildren(n, args...)
	defer cs.kill()
	if err != nil {
		return runResult{}, err
	}
	probe := startProbe(cs.pids(), broker)
	wal0 := sampleWAL(ctx, db)
	if err := cs.signal("go"); err != nil {
		return runResult{}, err
	}
	if err := waitFor(ctx, 3*time.Minute, func() (bool, error) {
		got, err := countRows(ctx, db, orders)
		return got >= o.n, err
	}); err != nil {
		return runResult{}, fmt.Errorf("waiting for %d orders: %w", o.n, err)
	}
	fsyncs, perSync := walRates(wal0, sampleWAL(ctx, db))
	cpu, load, reports, err := cs.finish(ctx, db, app, probe)
	if err != nil {
		return runResult{}, err
	}

	// Kafka: the group's members join (and the group rebalances) while
	// the first ones already consume, so the rate is taken over the
	// middle 80 % of the commits; RabbitMQ: over all of them.
	lo, hi := 0.0, 1.0
	if o.broker == "kafka" {
		lo, hi = 0.1, 0.9
	}
	var got int
	var span float64
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), EXTRACT(EPOCH FROM
	percentile_disc($2::float8) WITHIN GROUP (ORDER BY at) - percentile_disc($1::float8) WITHIN GROUP (ORDER BY at))::float8 FROM `+orders, lo, hi).Scan(&got, &span); err != nil {
		return runResult{}, err
	}
	if got != o.n {
		return runResult{}, fmt.Errorf("%d orders, want %d (each message's effect exactly once)", got, o.n)
	}
	var lat []time.Duration
	for _, r := range reports {
		for _, us := range r.LatenciesUS {
			lat = append(lat, time.Duration(us)*time.Microsecond)
		}
	}
	return runResult{rate: (hi - lo) * float64(o.n-1) / span, handlers: handlers, p50: stats.Percentile(lat, 50), p99: stats.Percentile(lat, 99), cpu: cpu, load: load,
		fsyncs: fsyncs, commitsPerSync: perSync}, nil
}

// runConsumerChild is a consumer process: a router with c.workers
// handlers on the queue, each behind the inbox. It prints "ready" once
// its database connections are open, starts on "go", and stops when
// stdin closes, printing its report.
func runConsumerChild(c childArgs) error {
	db, err := sql.Open("pgx", proc.AppDSN(c.pgDSN, c.app))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(c.workers + 1)
	db.SetMaxIdleConns(c.workers + 1)
	if err := warm(db, c.workers+1); err != nil {
		return err
	}
	repo, err := postgres.NewRepository(db, postgres.Config{Table: c.inbox})
	if err != nil {
		return err
	}
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "scaling"})
	if err != nil {
		return err
	}
	insert := `INSERT INTO ` + c.orders + ` (id, amount) VALUES ($1, $2)`
	handler := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(msg.Context(), insert, msg.UUID, len(msg.Payload))
		return nil, err
	})
	var (
		mu  sync.Mutex
		lat []int64
	)
	timed := func(msg *message.Message) error {
		start := time.Now()
		_, err := handler(msg)
		took := time.Since(start).Microseconds()
		mu.Lock()
		lat = append(lat, took)
		mu.Unlock()
		return err
	}

	logger := watermill.NopLogger{}
	var sub message.Subscriber
	handlers := c.workers
	if c.brokers != "" {
		// One subscription joins the group once; its concurrency is
		// the partitions it owns.
		sub, err = brokers.NewKafkaSubscriber(strings.Split(c.brokers, ","), "scaling-"+c.queue)
		handlers = 1
	} else {
		sub, err = amqp.NewSubscriber(brokers.AMQPConfig(c.amqpURL, c.prefetch), logger)
	}
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, logger)
	if err != nil {
		return err
	}
	for i := range handlers {
		router.AddConsumerHandler("h"+strconv.Itoa(i), c.queue, sub, timed)
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if line, err := in.ReadString('\n'); err != nil || line != "go\n" {
		return fmt.Errorf("expected go: %q %v", line, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	_, _ = in.ReadString('\n') // until stdin closes
	err = errors.Join(router.Close(), <-done)
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(err, json.NewEncoder(os.Stdout).Encode(report{LatenciesUS: lat}))
}

// warm opens n connections of db at once, so the backends exist (and
// are sampled) before the run starts.
func warm(db *sql.DB, n int) error {
	ctx := context.Background()
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		if err := c.PingContext(ctx); err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}
