package middleware_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// The inbox in front of a handler: the same message delivered three times
// charges once, and the duplicates get the stored output back.
func ExampleInbox() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	repo, _ := sqlite.NewRepository(db, sqlite.Config{})
	_ = repo.Migrate(context.Background())
	_, _ = db.Exec(`CREATE TABLE charges (order_id TEXT, amount INTEGER)`)

	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing"})
	if err != nil {
		panic(err)
	}
	charge := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO charges VALUES ('order-1', 1200)`); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage("payment-1", []byte(`{"order_id":"order-1"}`))}, nil
	})

	for range 3 {
		out, err := charge(message.NewMessage("order-1-uuid", []byte(`{"order_id":"order-1"}`)))
		fmt.Println(out[0].UUID, err)
	}
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n)
	// Output:
	// payment-1 <nil>
	// payment-1 <nil>
	// payment-1 <nil>
	// charges: 1
}

// Permanent inbox errors go to a poison queue instead of being retried
// forever; transient errors are still redelivered.
func ExampleIsPermanent() {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer pubSub.Close()
	router, _ := message.NewRouter(message.RouterConfig{}, logger)

	poison, err := wmiddleware.PoisonQueueWithFilter(pubSub, "orders.poison", idempotency.IsPermanent)
	if err != nil {
		panic(err)
	}
	// Order matters: the poison queue sees the inbox's errors.
	router.AddMiddleware(poison /* , inbox.Middleware */)

	fmt.Println(idempotency.IsPermanent(fmt.Errorf("consumer billing: %w", idempotency.ErrPayloadMismatch)))
	fmt.Println(idempotency.IsPermanent(fmt.Errorf("inbox: claim: %w", context.DeadlineExceeded)))
	// Output:
	// true
	// false
}

// A business key read from the payload, for producers that do not keep
// message UUIDs stable but do send a unique order id.
func ExampleJSONFieldKey() {
	key := middleware.JSONFieldKey("order", "id")
	k, err := key(message.NewMessage("any", []byte(`{"order":{"id":"A-17","total":12}}`)))
	fmt.Println(k, err)
	_, err = key(message.NewMessage("any", []byte(`{"order":{}}`)))
	fmt.Println(err)
	// Output:
	// A-17 <nil>
	// payload field "order.id" is missing
}

// CloudEvents in binary mode carry source and id in headers.
func ExampleCloudEventsKey() {
	msg := message.NewMessage("transport-uuid", nil)
	msg.Metadata.Set("ce_source", "/shop/orders")
	msg.Metadata.Set("ce_id", "1234")
	k, _ := middleware.CloudEventsKey(msg)
	fmt.Println(k)
	// Output:
	// 12:/shop/orders:1234
}
