// Command http runs one service with two doors: an HTTP API whose POST
// /orders honours the Idempotency-Key header (package httpidem), and a
// Watermill router whose shipping handler runs behind the inbox. Both keep
// their records in one SQLite database; no services needed.
//
//	go run ./examples/http
//
// A client posts an order, retries it with the same key (the stored 201
// is replayed, no second order), reuses the key for another order (422),
// forgets the key (400); another client sending the first one's key gets
// its own order. Each order is shipped once.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idemkit/watermill-idempotent/httpidem"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

func main() {
	dir, err := os.MkdirTemp("", "http-example-")
	if err == nil {
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err = run(ctx, filepath.Join(dir, "shop.db"), os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "http example:", err)
		os.Exit(1)
	}
}

// tokens stands in for authentication: bearer token → client.
var tokens = map[string]string{"token-alice": "alice", "token-bob": "bob"}

func clientOf(r *http.Request) (string, error) {
	if c, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]; ok {
		return c, nil
	}
	return "", errors.New("unknown token")
}

// Summary is what the demo observed.
type Summary struct {
	Statuses  []string
	Orders    int
	Shipments int
}

// run plays the demo. Its test passes extra router middleware (a
// duplicate injector) in wrap, outside the inbox.
func run(ctx context.Context, dbPath string, out io.Writer, wrap ...message.HandlerMiddleware) (Summary, error) {
	var s Summary
	db, err := sqlite.Open(dbPath)
	if err != nil {
		return s, err
	}
	defer db.Close()
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	if err != nil {
		return s, err
	}
	if err := repo.Migrate(ctx); err != nil {
		return s, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id INTEGER PRIMARY KEY, client TEXT, item TEXT);
		CREATE TABLE shipments (order_id INTEGER)`); err != nil {
		return s, err
	}
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	defer pubSub.Close()

	// The router side: ship each placed order once.
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return s, err
	}
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shipping"})
	if err != nil {
		return s, err
	}
	router.AddMiddleware(append(wrap, inbox.Middleware)...)
	router.AddConsumerHandler("shipping", "orders.placed", pubSub, func(msg *message.Message) error {
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(msg.Context(), `INSERT INTO shipments (order_id) VALUES (?)`, string(msg.Payload))
		return err
	})

	// The HTTP side: POST /orders with an Idempotency-Key, on the same store.
	idem, err := httpidem.New(httpidem.Config{Repository: repo, Namespace: "orders-api", Principal: clientOf})
	if err != nil {
		return s, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idem.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client, _ := clientOf(r)
		item, _ := io.ReadAll(r.Body)
		res, err := db.ExecContext(r.Context(), `INSERT INTO orders (client, item) VALUES (?, ?)`, client, string(item))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError) // 5xx: not stored, a retry runs again
			return
		}
		id, _ := res.LastInsertId()
		// The event's UUID derives from the request's key, so even a re-run
		// would publish a copy the shipping inbox recognises.
		key := r.Header.Get(httpidem.HeaderKey)
		event := message.NewMessage(idempotency.Derive(client+"/"+key, "order-placed"), fmt.Appendf(nil, "%d", id))
		if err := pubSub.Publish("orders.placed", event); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d: %s for %s\n", id, item, client)
	})))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return s, err
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	routerCtx, stopRouter := context.WithCancel(ctx)
	routerDone := make(chan struct{})
	go func() { defer close(routerDone); _ = router.Run(routerCtx) }()
	defer func() { stopRouter(); <-routerDone }() // running handlers finish before the database closes
	<-router.Running()

	base := "http://" + ln.Addr().String()
	post := func(what, token, key, item string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders", strings.NewReader(item))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if key != "" {
			req.Header.Set(httpidem.HeaderKey, `"`+key+`"`)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		status := fmt.Sprintf("%d", resp.StatusCode)
		if resp.Header.Get(httpidem.HeaderReplayed) == "true" {
			status += " replayed"
		}
		s.Statuses = append(s.Statuses, status)
		if resp.Header.Get("Content-Type") == "application/problem+json" {
			var problem struct{ Title string }
			_ = json.Unmarshal(body, &problem)
			body = []byte(problem.Title)
		}
		fmt.Fprintf(out, "%-38s → %-12s %s\n", what, status, strings.TrimSpace(string(body)))
		return nil
	}
	for _, p := range [][4]string{
		{"alice orders a lamp (key k-1)", "token-alice", "k-1", "lamp"},
		{"alice retries after a timeout (k-1)", "token-alice", "k-1", "lamp"},
		{"alice reuses k-1 for a chair", "token-alice", "k-1", "chair"},
		{"alice forgets the key", "token-alice", "", "chair"},
		{"bob sends alice's key k-1", "token-bob", "k-1", "lamp"},
	} {
		if err := post(p[0], p[1], p[2], p[3]); err != nil {
			return s, err
		}
	}

	// Wait for shipping to catch up with the orders.
	for {
		if err := db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM orders), (SELECT COUNT(*) FROM shipments)`).Scan(&s.Orders, &s.Shipments); err != nil {
			return s, err
		}
		if s.Shipments >= s.Orders {
			break
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	fmt.Fprintf(out, "%d orders, %d shipments: each order created and shipped once\n", s.Orders, s.Shipments)
	return s, nil
}
