package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// scenarioWatermillSQL is W: watermill-sql v3's exactly-once path on
// PostgreSQL. The messages wait in the SQL topic's table (published
// before the clock starts); the SQL subscriber reads a batch of up to
// batchSize messages in one transaction, hands each to the handler with
// that transaction in the context (wsql.TxFromContext), and commits the
// handler's writes together with the consumer group's new offset. batchSize
// 0 is watermill-sql's default (100).
//
// Concurrency c is c router handlers on the topic, so c consume loops of
// one consumer group. They take turns: each batch locks the group's offset
// row (SELECT … FOR UPDATE), which is how watermill-sql keeps order and
// exactly-once — so extra handlers add no parallelism.
//
// Latency is the handler's time; the batch's commit comes after the last
// handler of the batch and is not in it. The clock stops when the business
// table holds every row, i.e. after the last commit.
//
// Unlike every other scenario's, W's clock starts after the messages were
// published, so W's rate leaves out the publishing its broker (the SQL
// table) costs; withPublish is the same run with the publishing timed too
// (the bias, printed beside the ratio), c loops or not: every loop queues
// on the one offsets row.
func scenarioWatermillSQL(ctx context.Context, d *database, n, c, batchSize int) (consumed, withPublish result, err error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_w")
	if err != nil {
		return result{}, result{}, err
	}
	topic := "bench_w_" + randomSuffix()
	schema := wsql.DefaultPostgreSQLSchema{SubscribeBatchSize: batchSize}
	offsets := wsql.DefaultPostgreSQLOffsetsAdapter{}
	t.add("watermill_" + topic)
	t.add("watermill_offsets_" + topic)
	logger := watermill.NopLogger{}

	publisher, err := wsql.NewPublisher(d.db, wsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, logger)
	if err != nil {
		return result{}, result{}, err
	}
	msgs := newMessages(n)
	published := time.Now()
	for i := 0; i < len(msgs); i += 1000 {
		if err := publisher.Publish(topic, msgs[i:min(i+1000, len(msgs))]...); err != nil {
			return result{}, result{}, fmt.Errorf("watermill-sql publish: %w", err)
		}
	}
	publishing := time.Since(published)
	if err := publisher.Close(); err != nil {
		return result{}, result{}, err
	}

	subscriber, err := wsql.NewSubscriber(d.db, wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		SchemaAdapter:    schema,
		OffsetsAdapter:   offsets,
		InitializeSchema: true,
		PollInterval:     10 * time.Millisecond,
		RetryInterval:    10 * time.Millisecond,
	}, logger)
	if err != nil {
		return result{}, result{}, err
	}
	defer subscriber.Close()
	if err := subscriber.SubscribeInitialize(topic); err != nil {
		return result{}, result{}, err
	}

	rec := newRecorder(n)
	var handled atomic.Int64
	allHandled := make(chan struct{})
	var once sync.Once
	handler := rec.middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := wsql.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no watermill-sql transaction in the context")
		}
		if err := b.insert(msg.Context(), tx, msg); err != nil {
			return nil, err
		}
		if handled.Add(1) == int64(n) {
			once.Do(func() { close(allHandled) })
		}
		return nil, nil
	})

	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Minute}, logger)
	if err != nil {
		return result{}, result{}, err
	}
	for i := range c {
		router.AddConsumerHandler(fmt.Sprintf("w-%d", i), topic, subscriber, consume(handler))
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	routerErr := make(chan error, 1)
	start := time.Now()
	go func() { routerErr <- router.Run(runCtx) }()

	var elapsed time.Duration
	var waitErr error
	select {
	case <-allHandled:
		// The last batch commits after its last handler returns.
		deadline := time.Now().Add(time.Minute)
		for {
			got, err := b.count(ctx)
			if err != nil {
				waitErr = err
				break
			}
			if got >= n {
				elapsed = time.Since(start)
				break
			}
			if time.Now().After(deadline) {
				waitErr = fmt.Errorf("watermill-sql: %d of %d rows committed after a minute", got, n)
				break
			}
			time.Sleep(time.Millisecond)
		}
	case err := <-routerErr:
		return result{}, result{}, fmt.Errorf("router stopped early: %w", err)
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	closeErr := router.Close()
	runErr := <-routerErr
	if err := errors.Join(waitErr, closeErr, runErr, rec.err); err != nil {
		return result{}, result{}, err
	}
	consumed = result{n: n, elapsed: elapsed, latencies: rec.latencies}
	withPublish = consumed
	withPublish.elapsed += publishing
	return consumed, withPublish, b.expect(ctx, n)
}
