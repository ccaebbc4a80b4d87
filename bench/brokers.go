package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/watermill-idempotent/bench/internal/brokers"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// Scenario M is A and B end to end on a real broker: the same handler
// with and without the inbox, consuming messages published to RabbitMQ
// (watermill-amqp, a durable queue, c consumers with prefetch 8), NATS
// JetStream (watermill-nats, a work-queue stream, c pull subscribers of
// one durable consumer) or Kafka (watermill-kafka over Sarama against
// kfake in process, c partitions, one consumer-group member handling
// every partition at once). The messages are published before the
// clock starts; the clock runs from the first delivery's start to the
// last one's end, so it holds what a consumer costs: the broker's
// delivery and ack, the handler and the inbox.
//
//	M  A's handler, B's (inbox) and G's (group commit) on RabbitMQ, NATS
//	   JetStream and Kafka

// broker is one message broker of scenario M.
type broker struct {
	name string
	// open makes topic, publishes nothing, and returns a publisher to it,
	// a subscriber of it, how many router handlers give c deliveries in
	// flight, and a function that removes topic.
	open func(ctx context.Context, topic string, c int) (message.Publisher, message.Subscriber, int, func(), error)
}

// natsURL is the NATS server of scenario M (NATS_URL, as the examples).
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// availableBrokers returns the brokers that answer, and a note for each
// that does not.
func availableBrokers(ctx context.Context) ([]broker, []string) {
	var out []broker
	var notes []string
	amqpURL := testenv.AMQPURL()
	if conn, err := amqp091.Dial(amqpURL); err != nil {
		notes = append(notes, fmt.Sprintf("M on RabbitMQ skipped (%s=%s): %v", testenv.AMQPEnv, amqpURL, err))
	} else {
		_ = conn.Close()
		out = append(out, broker{"rabbitmq", func(_ context.Context, topic string, c int) (message.Publisher, message.Subscriber, int, func(), error) {
			pub, err := brokers.NewAMQPPublisher(amqpURL, topic)
			if err != nil {
				return nil, nil, 0, nil, err
			}
			sub, err := amqp.NewSubscriber(brokers.AMQPConfig(amqpURL, 8), watermill.NopLogger{})
			return pub, sub, c, func() { brokers.DeleteQueue(amqpURL, topic) }, err
		}})
	}
	if drop, err := brokers.NATSStream(ctx, natsURL(), "bench_m_probe"); err != nil {
		notes = append(notes, fmt.Sprintf("M on NATS skipped (NATS_URL=%s): %v", natsURL(), err))
	} else {
		drop()
		out = append(out, broker{"nats", func(ctx context.Context, topic string, c int) (message.Publisher, message.Subscriber, int, func(), error) {
			drop, err := brokers.NATSStream(ctx, natsURL(), topic)
			if err != nil {
				return nil, nil, 0, nil, err
			}
			pub, err := brokers.NewNATSPublisher(natsURL())
			if err != nil {
				drop()
				return nil, nil, 0, nil, err
			}
			sub, err := brokers.NewNATSSubscriber(natsURL(), "bench", 8)
			return pub, sub, c, drop, err
		}})
	}
	out = append(out, broker{"kafka", func(_ context.Context, topic string, c int) (message.Publisher, message.Subscriber, int, func(), error) {
		kf, err := brokers.StartKfake(topic, c)
		if err != nil {
			return nil, nil, 0, nil, err
		}
		pub, err := brokers.NewKafkaPublisher(kf.ListenAddrs())
		if err != nil {
			kf.Close()
			return nil, nil, 0, nil, err
		}
		sub, err := brokers.NewKafkaSubscriber(kf.ListenAddrs(), "bench")
		return pub, sub, 1, kf.Close, err
	}})
	return out, notes
}

// scenarioBroker is M: n messages through br at concurrency c, handled by
// A's handler, or by B's behind the inbox (configured by mutate: group
// commit).
func scenarioBroker(ctx context.Context, d *database, br broker, n, c int, inbox bool, mutate ...func(*middleware.Config)) (result, error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_m")
	if err != nil {
		return result{}, err
	}
	h := message.HandlerFunc(b.bare)
	if inbox {
		in, _, _, err := newInbox(ctx, d, t, nil, 0, mutate...)
		if err != nil {
			return result{}, err
		}
		h = in.Middleware(b.inInbox)
	}
	topic := "bench_m_" + randomSuffix()
	pub, sub, handlers, cleanup, err := br.open(ctx, topic, c)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", br.name, err)
	}
	defer sub.Close()
	err = brokers.PublishAll(pub, topic, n)
	if cerr := pub.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return result{}, fmt.Errorf("%s: publish: %w", br.name, err)
	}
	r, err := countRoundTrips(d.rt, func() (result, error) { return consumeAll(ctx, sub, topic, handlers, h, n) })
	if err != nil {
		return result{}, fmt.Errorf("%s: %w", br.name, err)
	}
	return r, b.expect(ctx, n)
}

// consumeAll runs a router of handlers router handlers on topic until n
// deliveries were handled; the clock runs from the first delivery's
// start to the last one's end.
func consumeAll(ctx context.Context, sub message.Subscriber, topic string, handlers int, h message.HandlerFunc, n int) (result, error) {
	rec := newRecorder(n)
	var first, last atomic.Int64
	allDone := make(chan struct{})
	var handled atomic.Int64
	timed := func(msg *message.Message) ([]*message.Message, error) {
		first.CompareAndSwap(0, time.Now().UnixNano())
		out, err := h(msg)
		last.Store(time.Now().UnixNano())
		if handled.Add(1) == int64(n) {
			close(allDone)
		}
		return out, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, watermill.NopLogger{})
	if err != nil {
		return result{}, err
	}
	chain := consume(rec.middleware(timed))
	for i := range handlers {
		router.AddConsumerHandler(fmt.Sprintf("m-%d", i), topic, sub, chain)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerErr := make(chan error, 1)
	go func() { routerErr <- router.Run(runCtx) }()
	var waitErr error
	select {
	case <-allDone:
	case err := <-routerErr:
		return result{}, fmt.Errorf("router stopped early: %w", err)
	case <-time.After(2 * time.Minute):
		waitErr = fmt.Errorf("%d of %d messages handled after 2 minutes", handled.Load(), n)
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	closeErr := router.Close()
	runErr := <-routerErr
	if err := errors.Join(waitErr, closeErr, runErr, rec.err); err != nil {
		return result{}, err
	}
	return result{n: n, elapsed: time.Duration(last.Load() - first.Load()), latencies: rec.latencies}, nil
}

// brokerRatios are M's lines in the ratio table.
var brokerRatios = []ratio{
	{"M/ inbox vs bare on RabbitMQ", "≥ 0.9", "M inbox", "rabbitmq", "M bare handler", "rabbitmq", fInbox, fBare},
	{"M/ inbox vs bare on NATS JetStream", "≥ 0.9", "M inbox", "nats", "M bare handler", "nats", fInbox, fBare},
	{"M/ inbox vs bare on Kafka (kfake)", "≥ 0.9", "M inbox", "kafka", "M bare handler", "kafka", fInbox, fBare},
	{"M/ group commit vs bare on RabbitMQ", "", "M inbox, group commit", "rabbitmq", "M bare handler", "rabbitmq", fGroup, fBare},
	{"M/ group commit vs bare on NATS JetStream", "", "M inbox, group commit", "nats", "M bare handler", "nats", fGroup, fBare},
	{"M/ group commit vs bare on Kafka (kfake)", "", "M inbox, group commit", "kafka", "M bare handler", "kafka", fGroup, fBare},
}

// printBrokerSplit prints, for M, where a delivery's time goes: the
// handler chain's mean time (the handler, and the inbox around it) beside
// the time a consumer spends per message (c / throughput), the rest being
// the broker's delivery and ack.
func printBrokerSplit(w io.Writer, rows []row) {
	var lines []string
	for _, r := range rows {
		if !strings.HasPrefix(r.label, "M ") || r.err != nil || r.r.n == 0 {
			continue
		}
		var sum time.Duration
		for _, l := range r.r.latencies {
			sum += l
		}
		handler := sum / time.Duration(len(r.r.latencies))
		perMsg := time.Duration(float64(r.c) / r.r.rate() * float64(time.Second))
		lines = append(lines, fmt.Sprintf("%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%.0f%%\t", r.label, r.backend, r.c, r.r.rate(), fmtDur(perMsg), fmtDur(handler), fmtDur(perMsg-handler), 100*float64(handler)/float64(perMsg)))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "M: a consumer's time per message (c / throughput), split into the handler chain's and the broker's (the rest)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tbroker\tconc\tmsgs/s\tper msg\thandler\tbroker\thandler share\t")
	for _, l := range lines {
		fmt.Fprintln(tw, l)
	}
	_ = tw.Flush()
}
