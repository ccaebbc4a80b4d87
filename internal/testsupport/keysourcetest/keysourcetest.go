// Package keysourcetest runs the README's router wiring — a poison queue
// outside the inbox, the inbox, a handler charging orders in the inbox
// transaction — on any subscriber, and counts what happened per order.
// The tests of keysource/... feed it messages from producers that are not
// Watermill.
package keysourcetest

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// Order is the payload producers send.
type Order struct {
	ID    string `json:"id"`
	Cents int64  `json:"cents"`
}

// Payload is o as JSON, the same bytes on every call.
func (o Order) Payload() []byte {
	b, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return b
}

// Config is one consumer.
type Config struct {
	// Store holds the inbox table and the charges table (a SQL backend).
	Store *backends.Store
	// Topic is consumed by the handler "billing" through Subscriber.
	Topic      string
	Subscriber message.Subscriber
	// PoisonTopic receives, through Poison, deliveries failing with a
	// permanent error.
	PoisonTopic string
	Poison      message.Publisher
	// Key is the inbox's KeyFunc; nil is the default, middleware.UUIDKey.
	Key middleware.KeyFunc
}

// Consumer is a running router. Its counts are safe to read at any time.
type Consumer struct {
	charges string
	store   *backends.Store

	mu     sync.Mutex
	runs   map[string]int              // order id → handler runs
	last   map[string]*message.Message // order id → the message of its last run
	acked  int                         // deliveries the router acknowledged
	signal chan struct{}               // receives after each acknowledgement
}

// Start runs the router until t ends.
func Start(t *testing.T, c Config) *Consumer {
	t.Helper()
	con := &Consumer{
		charges: backends.RandomName("charges"),
		store:   c.Store,
		runs:    map[string]int{},
		last:    map[string]*message.Message{},
		signal:  make(chan struct{}, 1),
	}
	db := c.Store.DB
	_, err := db.Exec(`CREATE TABLE ` + con.charges + ` (order_id TEXT NOT NULL, cents BIGINT NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + con.charges) })

	inbox, err := middleware.NewInbox(c.Store.SQL, middleware.Config{Consumer: "shop", Key: c.Key})
	require.NoError(t, err)
	poison, err := wmiddleware.PoisonQueueWithFilter(c.Poison, c.PoisonTopic, idempotency.IsPermanent)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddMiddleware(con.countAcked, poison, inbox.Middleware)
	router.AddConsumerHandler("billing", c.Topic, c.Subscriber, con.charge)

	done := make(chan error, 1)
	go func() { done <- router.Run(t.Context()) }()
	t.Cleanup(func() {
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
	})
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router stopped before running: %v", err)
	}
	return con
}

func (c *Consumer) countAcked(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			c.mu.Lock()
			c.acked++
			c.mu.Unlock()
			select {
			case c.signal <- struct{}{}:
			default:
			}
		}
		return out, err
	}
}

// charge runs inside the inbox transaction, as in the README.
func (c *Consumer) charge(msg *message.Message) error {
	var o Order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return fmt.Errorf("malformed order: %w", err)
	}
	tx, txErr := idempotency.Tx[*sql.Tx](msg.Context())
	if txErr != nil {
		return fmt.Errorf("charge must run inside the inbox middleware: %w", txErr)
	}
	query := `INSERT INTO ` + c.charges + ` (order_id, cents) VALUES ($1, $2)`
	if c.store.Name != "postgres" {
		query = `INSERT INTO ` + c.charges + ` (order_id, cents) VALUES (?, ?)`
	}
	if _, err := tx.ExecContext(msg.Context(), query, o.ID, o.Cents); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs[o.ID]++
	c.last[o.ID] = msg.Copy()
	return nil
}

// WaitAcked waits until the router has acknowledged n deliveries, and
// fails t after a minute or when more were acknowledged.
func (c *Consumer) WaitAcked(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		c.mu.Lock()
		acked := c.acked
		c.mu.Unlock()
		require.LessOrEqual(t, acked, n, "more deliveries acknowledged than sent")
		if acked == n {
			return
		}
		select {
		case <-c.signal:
		case <-timeout:
			t.Fatalf("%d of %d deliveries acknowledged after a minute", acked, n)
		}
	}
}

// Runs is the number of handler runs per order id.
func (c *Consumer) Runs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	runs := make(map[string]int, len(c.runs))
	for k, v := range c.runs {
		runs[k] = v
	}
	return runs
}

// Last is the message of order id's last handler run, or nil.
func (c *Consumer) Last(id string) *message.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last[id]
}

// Charges is the number of committed charge rows per order id.
func (c *Consumer) Charges(t *testing.T) map[string]int {
	t.Helper()
	rows, err := c.store.DB.Query(`SELECT order_id, COUNT(*) FROM ` + c.charges + ` GROUP BY order_id`)
	require.NoError(t, err)
	defer rows.Close()
	charges := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		charges[id] = n
	}
	require.NoError(t, rows.Err())
	return charges
}

// RequireOncePerOrder asserts that every order in ids ran the handler
// exactly once and has exactly one committed charge, and that nothing
// else ran or was charged.
func (c *Consumer) RequireOncePerOrder(t *testing.T, ids []string) {
	t.Helper()
	want := make(map[string]int, len(ids))
	for _, id := range ids {
		want[id] = 1
	}
	runs, charges := c.Runs(), c.Charges(t)
	c.mu.Lock()
	acked := c.acked
	c.mu.Unlock()
	t.Logf("%d deliveries acknowledged; %d orders ran the handler %d times; %d charges committed",
		acked, len(runs), sum(runs), sum(charges))
	require.Equal(t, want, runs, "handler runs per order")
	require.Equal(t, want, charges, "committed charges per order")
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// RequireUUIDKey asserts that an unmarshaler gave msg the UUID want, and
// that middleware.UUIDKey keys msg by it — or, for want "", refuses msg
// for its empty UUID.
func RequireUUIDKey(t *testing.T, msg *message.Message, want string) {
	t.Helper()
	require.Equal(t, want, msg.UUID)
	key, err := middleware.UUIDKey(msg)
	if want == "" {
		require.ErrorContains(t, err, "UUID is empty")
		return
	}
	require.NoError(t, err)
	require.Equal(t, want, key)
}
