package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Benchmarks: the outbox → GoChannel path of this package's Relay against
// watermill-sql's Subscriber + components/forwarder (the documented
// Watermill outbox) on the same database in the same run.
//
//	go test -run '^$' -bench Relay -benchmem ./outbox
//
// Throughput: 20,000 messages per op are committed first (untimed);
// the timer covers draining them to a GoChannel subscriber (msgs/s).
// Latency: 4 writers commit 2,000 messages, one per transaction, while the
// pipeline runs; the latency of a message is from just before its COMMIT to its
// arrival at the GoChannel subscriber (p50/p99 in ms).

const benchTopic = "bench.events"

type benchDB struct {
	name    string
	dialect sqldialect.Dialect
	open    func(testing.TB) *sql.DB
}

var benchDBs = []benchDB{
	{"postgres", sqldialect.PostgreSQL, testenv.Postgres},
	{"mariadb", sqldialect.MySQL, testenv.MySQL},
}

// pipeline is one outbox → GoChannel path under benchmark.
type pipeline interface {
	// write commits msgs in one transaction, calling beforeCommit (if
	// not nil) just before COMMIT.
	write(ctx context.Context, msgs []*message.Message, beforeCommit func()) error
	// start begins forwarding to pub; stop ends it.
	start(pub message.Publisher) (stop func())
}

// counter is a GoChannel subscriber noting when each message arrived.
type counter struct {
	mu      sync.Mutex
	arrived map[string]time.Time
	target  int
	done    chan struct{}
}

func newCounter(b *testing.B, target int) (*gochannel.GoChannel, *counter) {
	gc := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024}, watermill.NopLogger{})
	c := &counter{arrived: make(map[string]time.Time, target), target: target, done: make(chan struct{})}
	ch, err := gc.Subscribe(context.Background(), benchTopic)
	require.NoError(b, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for m := range ch {
			now := time.Now()
			m.Ack()
			c.mu.Lock()
			if _, dup := c.arrived[m.UUID]; !dup {
				c.arrived[m.UUID] = now
				if len(c.arrived) == c.target {
					close(c.done)
				}
			}
			c.mu.Unlock()
		}
	}()
	b.Cleanup(func() {
		_ = gc.Close()
		wg.Wait()
	})
	return gc, c
}

// wait returns when every message arrived. If none arrives for idle, it
// gives up and returns how many never came: fatal for our relay, reported
// as a "lost" metric for the baseline (watermill-sql's MySQL offsets can
// skip a row whose transaction commits after a higher id was read).
func (c *counter) wait(b *testing.B, idle time.Duration, allowLoss bool) (lost int) {
	last := -1
	for {
		select {
		case <-c.done:
			return 0
		case <-time.After(idle):
		}
		c.mu.Lock()
		n := len(c.arrived)
		c.mu.Unlock()
		if n == last {
			if !allowLoss {
				b.Fatalf("stalled: %d of %d messages arrived, none in the last %s", n, c.target, idle)
			}
			return c.target - n
		}
		last = n
	}
}

func benchMessages(prefix string, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("%s-%08d", prefix, i), []byte(`{"order_id":"o-123456","amount":1200,"currency":"EUR"}`))
		msgs[i].Metadata.Set("correlation_id", "c-1")
	}
	return msgs
}

// relayPipeline is this package's outbox and Relay.
type relayPipeline struct {
	b      *testing.B
	db     *sql.DB
	ob     *outbox.Outbox
	config outbox.RelayConfig
}

func newRelayPipeline(b *testing.B, d benchDB) pipeline {
	db := d.open(b)
	table := "bench_outbox_" + randomSuffix()
	ob, err := outbox.New(outbox.Config{Dialect: d.dialect, Table: table})
	require.NoError(b, err)
	require.NoError(b, ob.Migrate(context.Background(), db))
	b.Cleanup(backend{db: db, dialect: d.dialect, table: table}.drop)
	cfg := outbox.RelayConfig{Dialect: d.dialect, Table: table}
	if d.dialect == sqldialect.PostgreSQL {
		cfg.Notifier = pgxoutbox.Notifier(db)
	}
	return &relayPipeline{b: b, db: db, ob: ob, config: cfg}
}

func (p *relayPipeline) write(ctx context.Context, msgs []*message.Message, beforeCommit func()) error {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	out := make([]outbox.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = outbox.Outgoing{Topic: benchTopic, Message: m}
	}
	if err := p.ob.WriteTx(ctx, tx, out...); err != nil {
		_ = tx.Rollback()
		return err
	}
	if beforeCommit != nil {
		beforeCommit()
	}
	return tx.Commit()
}

func (p *relayPipeline) start(pub message.Publisher) func() {
	relay, err := outbox.NewRelay(p.db, pub, p.config)
	require.NoError(p.b, err)
	done := make(chan error, 1)
	go func() { done <- relay.Run(context.Background()) }()
	return func() {
		require.NoError(p.b, relay.Close())
		require.NoError(p.b, <-done)
	}
}

// forwarderPipeline is watermill-sql's Publisher (in the caller's
// transaction, through forwarder.Publisher's envelope), Subscriber and
// components/forwarder, all with their default settings.
type forwarderPipeline struct {
	b       *testing.B
	db      *sql.DB
	schema  wsql.SchemaAdapter
	offsets wsql.OffsetsAdapter
	topic   string
}

func newForwarderPipeline(b *testing.B, d benchDB) pipeline {
	db := d.open(b)
	suffix := randomSuffix()
	p := &forwarderPipeline{b: b, db: db, topic: "fwd_" + suffix}
	var drop []string
	if d.dialect == sqldialect.PostgreSQL {
		p.schema = wsql.DefaultPostgreSQLSchema{}
		p.offsets = wsql.DefaultPostgreSQLOffsetsAdapter{}
		drop = []string{`"watermill_` + p.topic + `"`, `"watermill_offsets_` + p.topic + `"`}
	} else {
		p.schema = wsql.DefaultMySQLSchema{}
		p.offsets = wsql.DefaultMySQLOffsetsAdapter{}
		drop = []string{"`watermill_" + p.topic + "`", "`watermill_offsets_" + p.topic + "`"}
	}
	sub := p.subscriber()
	require.NoError(b, sub.SubscribeInitialize(p.topic))
	require.NoError(b, sub.Close())
	b.Cleanup(func() {
		for _, t := range drop {
			_, _ = db.Exec(`DROP TABLE ` + t)
		}
	})
	return p
}

func (p *forwarderPipeline) subscriber() *wsql.Subscriber {
	sub, err := wsql.NewSubscriber(p.db, wsql.SubscriberConfig{
		SchemaAdapter:    p.schema,
		OffsetsAdapter:   p.offsets,
		InitializeSchema: true,
	}, nil)
	require.NoError(p.b, err)
	return sub
}

func (p *forwarderPipeline) write(ctx context.Context, msgs []*message.Message, beforeCommit func()) error {
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	sqlPub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: p.schema}, nil)
	if err != nil {
		_ = tx.Rollback()
		return err
	}
	pub := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: p.topic})
	if err := pub.Publish(benchTopic, msgs...); err != nil {
		_ = tx.Rollback()
		return err
	}
	if beforeCommit != nil {
		beforeCommit()
	}
	return tx.Commit()
}

func (p *forwarderPipeline) start(pub message.Publisher) func() {
	sub := p.subscriber()
	fwd, err := forwarder.NewForwarder(sub, pub, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: p.topic})
	require.NoError(p.b, err)
	done := make(chan error, 1)
	go func() { done <- fwd.Run(context.Background()) }()
	<-fwd.Running()
	return func() {
		require.NoError(p.b, fwd.Close())
		require.NoError(p.b, <-done)
		require.NoError(p.b, sub.Close())
	}
}

var pipelines = []struct {
	name      string
	new       func(*testing.B, benchDB) pipeline
	allowLoss bool
}{
	{"relay", newRelayPipeline, false},
	{"watermill-sql-forwarder", newForwarderPipeline, true},
}

// Messages per benchmark operation. A fixed, large count per op keeps
// the numbers meaningful at any -benchtime: with b.N messages, the
// baseline's 1 s poll made b.N=1 look "done".
const (
	drainPerOp   = 20_000
	latencyPerOp = 2_000
)

func BenchmarkRelayThroughput(b *testing.B) {
	for _, d := range benchDBs {
		for _, pl := range pipelines {
			b.Run(d.name+"/"+pl.name, func(b *testing.B) {
				p := pl.new(b, d)
				ctx := context.Background()
				var elapsed time.Duration
				b.ResetTimer()
				for op := range b.N {
					b.StopTimer()
					msgs := benchMessages(fmt.Sprintf("tp%d", op), drainPerOp)
					for start := 0; start < len(msgs); start += 2000 {
						require.NoError(b, p.write(ctx, msgs[start:min(start+2000, len(msgs))], nil))
					}
					gc, c := newCounter(b, drainPerOp)
					b.StartTimer()

					began := time.Now()
					stop := p.start(gc)
					lost := c.wait(b, 5*time.Second, false)
					elapsed += time.Since(began)
					b.StopTimer()
					stop()
					if lost > 0 {
						b.Fatalf("%d of %d messages never arrived", lost, drainPerOp)
					}
				}
				b.ReportMetric(float64(b.N*drainPerOp)/elapsed.Seconds(), "msgs/s")
			})
		}
	}
}

func BenchmarkRelayLatency(b *testing.B) {
	for _, d := range benchDBs {
		for _, pl := range pipelines {
			b.Run(d.name+"/"+pl.name, func(b *testing.B) {
				const writers = 4
				p := pl.new(b, d)
				ctx := context.Background()
				var (
					lat     []time.Duration
					lost    int
					elapsed time.Duration
				)
				b.ResetTimer()
				for op := range b.N {
					b.StopTimer()
					gc, c := newCounter(b, latencyPerOp)
					msgs := benchMessages(fmt.Sprintf("lat%d", op), latencyPerOp)
					committing := make([]time.Time, latencyPerOp)
					stop := p.start(gc)
					b.StartTimer()

					began := time.Now()
					var next atomic.Int64
					var wg sync.WaitGroup
					for range writers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for {
								i := int(next.Add(1)) - 1
								if i >= latencyPerOp {
									return
								}
								// Measured from just before COMMIT: includes the
								// commit itself, so it overstates, never understates.
								mark := func() { committing[i] = time.Now() }
								if err := p.write(ctx, msgs[i:i+1], mark); err != nil {
									b.Error(err)
									return
								}
							}
						}()
					}
					wg.Wait()
					lost += c.wait(b, 5*time.Second, pl.allowLoss)
					elapsed += time.Since(began)
					b.StopTimer()
					stop()

					c.mu.Lock()
					for i, m := range msgs {
						if at, ok := c.arrived[m.UUID]; ok {
							lat = append(lat, max(at.Sub(committing[i]), 0))
						}
					}
					c.mu.Unlock()
				}
				slices.Sort(lat)
				pct := func(q float64) float64 {
					return float64(lat[min(int(q*float64(len(lat))), len(lat)-1)]) / float64(time.Millisecond)
				}
				b.ReportMetric(pct(0.50), "p50-ms")
				b.ReportMetric(pct(0.99), "p99-ms")
				b.ReportMetric(float64(lost), "lost")
				if lost > 0 {
					b.Logf("%s/%s: %d of %d messages never arrived (writers committing out of order)", d.name, pl.name, lost, b.N*latencyPerOp)
				}
			})
		}
	}
}
