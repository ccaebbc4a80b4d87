package middleware_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// bus is the broker of a fan-out test: a publisher and, per consumer
// group, a subscriber that gets its own copy of every message of a topic.
type bus struct {
	name      string
	publisher message.Publisher
	subscribe func(t *testing.T, group string) message.Subscriber
}

// goChannelBus is one in-memory GoChannel: every subscription of a topic
// gets every message.
func goChannelBus(t *testing.T) *bus {
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1024, Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { require.NoError(t, pubSub.Close()) })
	return &bus{
		name:      "gochannel",
		publisher: pubSub,
		subscribe: func(*testing.T, string) message.Subscriber { return pubSub },
	}
}

// amqpBus is RabbitMQ through watermill-amqp's durable pub/sub topology:
// a fanout exchange per topic and a queue per topic and group. The queues
// and exchanges it creates are deleted when t ends.
func amqpBus(t *testing.T) *bus {
	url := testenv.AMQP(t)
	var mu sync.Mutex
	queues, exchanges := map[string]bool{}, map[string]bool{}
	config := func(group string) amqp.Config {
		c := amqp.NewDurablePubSubConfig(url, func(topic string) string {
			mu.Lock()
			defer mu.Unlock()
			queues[topic+"_"+group] = true
			exchanges[topic] = true
			return topic + "_" + group
		})
		c.Publish.ConfirmDelivery = true
		return c
	}
	pub, err := amqp.NewPublisher(config(""), watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, pub.Close())
		mu.Lock()
		defer mu.Unlock()
		conn, err := amqp091.Dial(url)
		require.NoError(t, err)
		defer conn.Close()
		for q := range queues {
			ch, err := conn.Channel()
			require.NoError(t, err)
			_, err = ch.QueueDelete(q, false, false, false)
			require.NoError(t, err)
			require.NoError(t, ch.Close())
		}
		for e := range exchanges {
			ch, err := conn.Channel()
			require.NoError(t, err)
			require.NoError(t, ch.ExchangeDelete(e, false, false))
			require.NoError(t, ch.Close())
		}
	})
	return &bus{
		name:      "rabbitmq",
		publisher: pub,
		subscribe: func(t *testing.T, group string) message.Subscriber {
			sub, err := amqp.NewSubscriber(config(group), watermill.NopLogger{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			return sub
		},
	}
}

// fanout is a router whose handlers all subscribe to one input topic,
// each with its own output topic, and whose inbox is added router-wide
// with router.AddMiddleware — the wiring most Watermill users write.
type fanout struct {
	bus      *bus
	input    string
	service  string // "" or the service the router belongs to, naming its subscriptions and output topics
	handlers []string
	router   *message.Router

	mu      sync.Mutex
	runs    map[string]map[string]int                                 // handler → order → handler runs
	scopes  map[string]map[string]bool                                // handler → scopes seen by its runs
	acked   map[string]int                                            // handler → acknowledged deliveries
	outputs map[string][]*message.Message                             // handler → messages on its output topic
	effect  func(msg *message.Message, handler, orderID string) error // optional, inside the run
}

// group is the consumer group of a handler's subscription: the handler
// name, prefixed with the service's when there is one, so that each
// service gets its own copy of every message.
func (f *fanout) group(handler string) string {
	if f.service == "" {
		return handler
	}
	return f.service + "_" + handler
}

func (f *fanout) outputTopic(handler string) string { return f.input + "_" + f.group(handler) }

// newFanout builds the router: inbox is added router-wide after a counter
// of acknowledged deliveries. Handlers are registered under their names
// and tag their output with the handler that produced it.
func newFanout(t *testing.T, b *bus, inbox message.HandlerMiddleware, handlers ...string) *fanout {
	return newServiceFanout(t, b, randomName("orders"), "", inbox, handlers...)
}

// newServiceFanout is newFanout for one of several services consuming
// the topic input: each has its own subscriptions and output topics.
func newServiceFanout(t *testing.T, b *bus, input, service string, inbox message.HandlerMiddleware, handlers ...string) *fanout {
	f := &fanout{
		bus:      b,
		input:    input,
		service:  service,
		handlers: handlers,
		runs:     map[string]map[string]int{},
		scopes:   map[string]map[string]bool{},
		acked:    map[string]int{},
		outputs:  map[string][]*message.Message{},
	}
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	f.router = r
	r.AddMiddleware(f.countAcked, inbox)
	for _, name := range handlers {
		f.runs[name] = map[string]int{}
		f.scopes[name] = map[string]bool{}
		r.AddHandler(name, f.input, b.subscribe(t, f.group(name)), f.outputTopic(name), b.publisher, f.handler(name))
	}
	return f
}

func (f *fanout) countAcked(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			f.mu.Lock()
			f.acked[message.HandlerNameFromCtx(msg.Context())]++
			f.mu.Unlock()
		}
		return out, err
	}
}

func (f *fanout) handler(name string) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var o order
		if err := json.Unmarshal(msg.Payload, &o); err != nil {
			return nil, err
		}
		scope, _ := idempotency.ScopeFromContext(msg.Context())
		f.mu.Lock()
		f.runs[name][o.ID]++
		f.scopes[name][scope] = true
		f.mu.Unlock()
		if f.effect != nil {
			if err := f.effect(msg, name, o.ID); err != nil {
				return nil, err
			}
		}
		out := message.NewMessage(watermill.NewUUID(), []byte(name+" handled "+o.ID))
		out.Metadata.Set("handler", name)
		out.Metadata.Set("order_id", o.ID)
		return []*message.Message{out}, nil
	}
}

// run subscribes collectors to every output topic, starts the router and
// publishes orders orders, each copies times with the same UUID (a
// producer retrying). It returns once every handler acknowledged every
// copy and every output topic received one message per copy.
func (f *fanout) run(t *testing.T, orders, copies int) {
	f.start(t)
	f.publish(t, orders, copies)
	f.wait(t, orders*copies)
}

// start subscribes collectors to every output topic and starts the
// router; it returns once the router runs.
func (f *fanout) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	for _, name := range f.handlers {
		msgs, err := f.bus.subscribe(t, "collector").Subscribe(ctx, f.outputTopic(name))
		require.NoError(t, err)
		go func() {
			for m := range msgs {
				f.mu.Lock()
				f.outputs[name] = append(f.outputs[name], m)
				f.mu.Unlock()
				m.Ack()
			}
		}()
	}
	done := make(chan error, 1)
	go func() { done <- f.router.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	<-f.router.Running()
}

// publish publishes orders orders to the input topic, each copies times
// with the same UUID.
func (f *fanout) publish(t *testing.T, orders, copies int) {
	for i := range orders {
		for range copies {
			require.NoError(t, f.bus.publisher.Publish(f.input,
				orderMessage(fmt.Sprintf("%s-uuid-%d", f.input, i), order{ID: fmt.Sprintf("o-%d", i), Amount: 10 + i})))
		}
	}
}

// wait returns once every handler acknowledged published deliveries and
// every output topic received published messages.
func (f *fanout) wait(t *testing.T, published int) {
	require.Eventually(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, name := range f.handlers {
			if f.acked[name] < published || len(f.outputs[name]) < published {
				return false
			}
		}
		return true
	}, 2*waitFor, 10*time.Millisecond, "waiting for %d acknowledged deliveries and outputs per handler", published)
}

// summary is what a fan-out run did, per handler, in one line each.
func (f *fanout) summary(orders, copies int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var lines []string
	for _, name := range f.handlers {
		runs := 0
		for _, n := range f.runs[name] {
			runs += n
		}
		from := map[string]int{}
		for _, m := range f.outputs[name] {
			from[m.Metadata.Get("handler")]++
		}
		var origins []string
		for h, n := range from {
			origins = append(origins, fmt.Sprintf("%d from %s", n, h))
		}
		sort.Strings(origins)
		scopes := make([]string, 0, len(f.scopes[name]))
		for s := range f.scopes[name] {
			scopes = append(scopes, fmt.Sprintf("%q", s))
		}
		sort.Strings(scopes)
		lines = append(lines, fmt.Sprintf("%s: ran %d times for %d orders (%d orders never ran), %d copies acknowledged, topic %s got %d messages (%s), scopes %s",
			name, runs, orders, orders-len(f.runs[name]), f.acked[name], f.outputTopic(name), len(f.outputs[name]), strings.Join(origins, ", "), strings.Join(scopes, ",")))
	}
	return strings.Join(lines, "\n")
}

func (f *fanout) log(t *testing.T, orders, copies int) {
	t.Helper()
	service := ""
	if f.service != "" {
		service = "service " + f.service + ", "
	}
	t.Logf("%s, %s%d handlers, %d orders × %d copies:\n%s", f.bus.name, service, len(f.handlers), orders, copies, f.summary(orders, copies))
}

// requireEachHandlerOnce checks the fan-out outcome: every handler ran
// exactly once per order, its output topic carries only its own messages
// — one per published copy (first run or replay), with one UUID per
// order — and every handler acknowledged every copy.
func (f *fanout) requireEachHandlerOnce(t *testing.T, orders, copies int) {
	t.Helper()
	f.log(t, orders, copies)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, name := range f.handlers {
		require.Len(t, f.runs[name], orders, "%s ran for every order", name)
		for o, n := range f.runs[name] {
			require.Equal(t, 1, n, "%s ran %s once", name, o)
		}
		require.Equal(t, orders*copies, f.acked[name], "%s acknowledged every copy", name)
		require.Len(t, f.outputs[name], orders*copies, "one message on %s per copy", f.outputTopic(name))
		uuids, ids := map[string]int{}, map[string]int{}
		for _, m := range f.outputs[name] {
			require.Equal(t, name, m.Metadata.Get("handler"), "%s carries only %s's output", f.outputTopic(name), name)
			uuids[m.UUID]++
			ids[m.Metadata.Get("order_id")]++
		}
		require.Len(t, uuids, orders, "replays repeat the first run's UUID")
		require.Len(t, ids, orders)
		for _, n := range uuids {
			require.Equal(t, copies, n)
		}
		require.Len(t, f.scopes[name], 1, "one scope per handler")
	}
	seen := map[string]string{}
	for _, name := range f.handlers {
		for s := range f.scopes[name] {
			require.NotContains(t, seen, s, "handlers %s and %s share scope %q", seen[s], name, s)
			seen[s] = name
		}
	}
}

// inboxMode builds the middleware of one inbox mode on a store.
type inboxMode struct {
	name string
	new  func(t *testing.T, s *store, consumer string) message.HandlerMiddleware
}

var inboxModes = []inboxMode{
	{"transactional", func(t *testing.T, s *store, consumer string) message.HandlerMiddleware {
		return s.newInbox(t, consumer).Middleware
	}},
	{"two-phase", func(t *testing.T, s *store, consumer string) message.HandlerMiddleware {
		repo := s.leaseRepo()
		inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: repo, Consumer: consumer})
		require.NoError(t, err)
		return inbox.Middleware
	}},
}

// chargeEffect makes each run write a charge row named after its handler
// in the inbox transaction (transactional mode only).
func chargeEffect(s *store) func(msg *message.Message, handler, orderID string) error {
	return func(msg *message.Message, handler, orderID string) error {
		tx, txErr := idempotency.Tx[*sql.Tx](msg.Context())
		if txErr != nil {
			return nil
		}
		_, err := tx.ExecContext(msg.Context(), s.q(`INSERT INTO `+s.charges+` (order_id, amount) VALUES (?, 1)`), handler+"/"+orderID)
		return err
	}
}

// fanoutBackend is a broker and a store for fan-out tests.
type fanoutBackend struct {
	bus   func(*testing.T) *bus
	store func(testing.TB) *store
}

// fanoutBackends are the in-memory broker on SQLite and RabbitMQ on
// PostgreSQL.
var fanoutBackends = map[string]fanoutBackend{
	"gochannel+sqlite":  {goChannelBus, newSQLiteStore},
	"rabbitmq+postgres": {amqpBus, newPostgresStore},
}

// TestRouterWideInboxScopesEachHandler is issue 11's reproduction: the
// inbox added with router.AddMiddleware under one Consumer, and two or
// three handlers subscribed to the same topic. Each handler must run
// exactly once per order and publish only its own output, while copies
// with the same UUID stay duplicates per handler.
func TestRouterWideInboxScopesEachHandler(t *testing.T) {
	for name, b := range fanoutBackends {
		for _, mode := range inboxModes {
			for _, handlers := range [][]string{{"billing", "audit"}, {"billing", "audit", "shipping"}} {
				t.Run(fmt.Sprintf("%s/%s/%d-handlers", name, mode.name, len(handlers)), func(t *testing.T) {
					if testing.Short() && strings.HasPrefix(name, "rabbitmq") {
						t.Skip("RabbitMQ fan-out runs take seconds; skipped with -short")
					}
					t.Parallel()
					s := b.store(t)
					f := newFanout(t, b.bus(t), mode.new(t, s, "billing"), handlers...)
					f.effect = chargeEffect(s)
					const orders, copies = 20, 2
					f.run(t, orders, copies)
					f.requireEachHandlerOnce(t, orders, copies)
					if mode.name == "transactional" {
						require.Equal(t, orders*len(handlers), s.totalCharges(t))
						for _, h := range handlers {
							for i := range orders {
								require.Equal(t, 1, s.chargesFor(t, fmt.Sprintf("%s/o-%d", h, i)))
							}
						}
					}
				})
			}
		}
	}
}
