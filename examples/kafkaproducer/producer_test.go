package kafkaproducer_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/watermill-idempotent/examples/kafkaproducer"
)

const (
	sent      = 100 // messages published, one Publish each
	loseEvery = 10  // every 10th produce request loses its answer
)

// TestIdempotentProducerStoresRetriesOnce publishes 100 messages through
// watermill-kafka's publisher to kfake while every 10th produce request
// is applied by the broker but its answer is lost — the connection is cut
// before the answer leaves, or the broker answers REQUEST_TIMED_OUT after
// the append — so Sarama retries it. Without the idempotent producer each
// retry is stored again (a duplicate for the consumers); with it the
// broker recognises the retry and the topic holds each message once.
func TestIdempotentProducerStoresRetriesOnce(t *testing.T) {
	for _, loss := range []string{"connection cut", "request timed out"} {
		for _, idempotent := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/idempotent=%v", loss, idempotent), func(t *testing.T) {
				r := measure(t, loss, idempotent)
				t.Logf("%s, idempotent=%v: %d sent, %d answers lost, %d stored, %d distinct, %d duplicates, %d publishes failed and sent again",
					loss, idempotent, sent, r.lost, r.stored, r.distinct, r.stored-r.distinct, r.failed)
				require.Equal(t, sent, r.distinct, "every message stored")
				require.Positive(t, r.lost, "no answer was lost: the test measured nothing")
				if idempotent {
					// Producer retries add nothing; a publish the
					// application sent again may (at most one copy each).
					require.LessOrEqual(t, r.stored, sent+r.failed, "the idempotent producer stores each retry once")
					require.Less(t, r.stored, sent+r.lost, "the idempotent producer stores fewer copies than retries")
				} else {
					require.Equal(t, sent+r.lost, r.stored, "each lost answer's retry is stored again")
				}
			})
		}
	}
}

// result counts one run: answers lost, records stored, distinct UUIDs
// among them, and publishes that failed and were published again.
type result struct{ lost, stored, distinct, failed int }

func measure(t *testing.T, loss string, idempotent bool) result {
	var produces, lost atomic.Int64
	loseThis := func() bool {
		if produces.Add(1)%loseEvery != 0 {
			return false
		}
		lost.Add(1)
		return true
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(1, "orders")}
	if loss == "connection cut" {
		opts = append(opts, kfake.ListenFn(func(network, address string) (net.Listener, error) {
			ln, err := net.Listen(network, address)
			return &lossyListener{Listener: ln, lose: loseThis}, err
		}))
	}
	var faults *kfake.FaultHandle
	cluster, err := kfake.NewCluster(opts...)
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	if loss == "request timed out" {
		// kfake appends a produce answered REQUEST_TIMED_OUT, as a broker
		// whose replicas did not confirm in time does.
		// When runs at each check of a request (the topic's, then the
		// partition's), so the decision is taken once per request.
		var last kmsg.Request
		var lastLost bool
		faults = cluster.Fault(kfake.Fault{
			Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: -1,
			When: func(req kmsg.Request) bool {
				if req != last {
					last, lastLost = req, loseThis()
				}
				return lastLost
			},
		})
	}

	sc := kafka.DefaultSaramaSyncPublisherConfig()
	sc.Version = sarama.V2_3_0_0 // the newest kfake accepts from Sarama
	sc.Producer.Retry.Backoff = 0
	if idempotent {
		sc = kafkaproducer.Idempotent(sc)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: cluster.ListenAddrs(), Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	defer pub.Close()
	var failed int
	for i := range sent {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order %d", i))
		// A publish that fails is published again, as the outbox relay
		// does. Sarama's idempotent producer now and then fails one after
		// a cut connection (OUT_OF_ORDER_SEQUENCE_NUMBER, about 1 run in
		// 15 here): its copy is then the application's, not a producer
		// retry, and the consumers' inbox is what absorbs it.
		for err := pub.Publish("orders", msg); err != nil; err = pub.Publish("orders", msg) {
			failed++
			require.Less(t, failed, 5, "publishes keep failing: %v", err)
		}
	}

	stored, distinct := readAll(t, cluster.ListenAddrs(), "orders")
	if faults != nil {
		require.Equal(t, lost.Load(), int64(faults.Hits()), "every answer picked was faulted")
	}
	return result{lost: int(lost.Load()), stored: stored, distinct: distinct, failed: failed}
}

// readAll reads partition 0 of topic from the start to its end and
// counts the records and the distinct message UUIDs among them.
func readAll(t *testing.T, brokers []string, topic string) (stored, distinct int) {
	sc := sarama.NewConfig()
	sc.Version = sarama.V2_3_0_0
	client, err := sarama.NewClient(brokers, sc)
	require.NoError(t, err)
	defer client.Close()
	end, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	require.NoError(t, err)
	consumer, err := sarama.NewConsumerFromClient(client)
	require.NoError(t, err)
	defer consumer.Close()
	pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
	require.NoError(t, err)
	defer pc.Close()
	uuids := map[string]bool{}
	for stored < int(end) {
		m := <-pc.Messages()
		stored++
		for _, h := range m.Headers {
			if string(h.Key) == kafka.UUIDHeaderKey {
				uuids[string(h.Value)] = true
			}
		}
		if m.Offset == end-1 {
			break
		}
	}
	return stored, len(uuids)
}

// lossyListener hands kfake connections that lose the answer of the
// produce requests lose picks: the broker has applied the request when it
// writes the answer, and the connection is closed instead.
type lossyListener struct {
	net.Listener
	lose func() bool
}

func (l *lossyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, lose: l.lose, doomed: map[int32]bool{}}, nil
}

// lossyConn reads the Kafka request frames (size, api key, version,
// correlation id) going to the broker and the response frames (size,
// correlation id) coming back.
type lossyConn struct {
	net.Conn
	lose func() bool

	mu      sync.Mutex
	in, out []byte
	doomed  map[int32]bool // correlation ids whose answer is lost
	cut     bool
}

func (c *lossyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.in = append(c.in, p[:n]...)
	for len(c.in) >= 12 {
		size := int(binary.BigEndian.Uint32(c.in))
		if len(c.in) < 4+size {
			break
		}
		key := int16(binary.BigEndian.Uint16(c.in[4:]))
		corr := int32(binary.BigEndian.Uint32(c.in[8:]))
		if key == int16(kmsg.Produce) && c.lose() {
			c.doomed[corr] = true
		}
		c.in = c.in[4+size:]
	}
	return n, err
}

func (c *lossyConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut {
		return 0, net.ErrClosed
	}
	c.out = append(c.out, p...)
	for len(c.out) >= 8 {
		size := int(binary.BigEndian.Uint32(c.out))
		if len(c.out) < 4+size {
			break
		}
		frame := c.out[:4+size]
		if c.doomed[int32(binary.BigEndian.Uint32(c.out[4:]))] {
			c.cut = true
			_ = c.Conn.Close()
			return 0, net.ErrClosed
		}
		if _, err := c.Conn.Write(frame); err != nil {
			return 0, err
		}
		c.out = c.out[4+size:]
	}
	return len(p), nil
}
