// Command quickstart plays a small order → payment flow through a Watermill
// router with the inbox middleware, a transactional outbox and its relay,
// on SQLite and an in-process GoChannel: no services needed.
//
//	go run ./examples/quickstart
//
// The producer re-sends some orders (duplicates on the wire), one handler
// run fails and is redelivered, and one delivery "crashes" after its
// transaction committed but before the broker saw the ack. The billing
// handler's payment events are written to the outbox in the inbox
// transaction (middleware.Config.Outputs), so they commit with the charge
// or not at all, and the relay publishes them. The summary shows every
// order charged exactly once and one payment event per charge, so the
// downstream receipts consumer — another inbox — sends one receipt per
// payment.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func main() {
	dir, err := os.MkdirTemp("", "quickstart-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := run(ctx, filepath.Join(dir, "quickstart.db"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

// OrderPlaced is the event the billing consumer handles.
type OrderPlaced struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount_cents"`
}

// PaymentCompleted is the event billing emits for each charged order.
type PaymentCompleted struct {
	OrderID  string `json:"order_id"`
	Customer string `json:"customer"`
	Amount   int    `json:"amount_cents"`
}

var orders = []OrderPlaced{
	{"order-1", "alice", 1200}, {"order-2", "bob", 550}, {"order-3", "carol", 9900},
	{"order-4", "alice", 300}, {"order-5", "bob", 4200}, {"order-6", "carol", 100},
	{"order-7", "alice", 2500}, {"order-8", "bob", 800}, {"order-9", "carol", 650},
	{"order-10", "alice", 75},
}

// What goes wrong on the way.
var (
	resentByProducer = map[string]bool{"order-2": true, "order-5": true, "order-9": true}
	failsOnce        = "order-4" // the card network times out on the first try
	crashesBeforeAck = "order-7" // committed, then the process dies before acking
)

// Summary is what the quickstart counted.
type Summary struct {
	Orders, Published int

	// BillingDeliveries = Charged + Failed + Duplicates.
	BillingDeliveries int // deliveries the billing handler's inbox saw
	Charged           int // handler runs that committed (Crashed included)
	Failed            int // handler runs that failed and were redelivered
	Crashed           int // of the Charged: "lost" after commit, before the ack
	Duplicates        int // deliveries acknowledged without running the handler
	Replayed          int // payment events returned by those duplicates: none, the outbox has them

	Relayed         int // payment events the relay published from the outbox: one per charge
	OutboxLeft      int // outbox rows left after the relay stopped
	PaymentEvents   int // payment events delivered downstream
	ReceiptsSent    int
	ReceiptsSkipped int

	// ChargedCents and ChargeCount are per customer, read from the database.
	ChargedCents map[string]int
	ChargeCount  map[string]int
}

func run(ctx context.Context, dbPath string, w io.Writer) (Summary, error) {
	db, err := sqlite.Open(dbPath)
	if err != nil {
		return Summary{}, err
	}
	defer db.Close()
	repo, ob, err := migrate(ctx, db)
	if err != nil {
		return Summary{}, err
	}
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, logger)
	defer pubSub.Close()

	f := &flow{s: Summary{Orders: len(orders)}, failed: map[string]bool{}, crashed: map[string]bool{}}
	router, err := f.router(db, repo, ob, pubSub, logger)
	if err != nil {
		return Summary{}, err
	}
	// The relay publishes committed outbox rows to the broker. SQLite
	// has no LISTEN: it polls.
	relay, err := outbox.NewRelay(db, pubSub, outbox.RelayConfig{Dialect: sqldialect.SQLite, PollInterval: 10 * time.Millisecond, Logger: logger})
	if err != nil {
		return Summary{}, err
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	routerDone, relayDone := make(chan error, 1), make(chan error, 1)
	go func() { routerDone <- router.Run(runCtx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return Summary{}, err
	}
	go func() { relayDone <- relay.Run(runCtx) }()

	if err := f.produce(pubSub); err != nil {
		return Summary{}, err
	}
	if err := f.settle(ctx, db); err != nil {
		return Summary{}, err
	}
	stop()
	if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
		return Summary{}, err
	}
	if err := <-routerDone; err != nil {
		return Summary{}, err
	}

	s := f.s
	s.PaymentEvents = int(f.receiptAcked.Load())
	s.Relayed = s.PaymentEvents
	s.ReceiptsSkipped = s.PaymentEvents - s.ReceiptsSent
	if s.ChargedCents, s.ChargeCount, err = chargesByCustomer(ctx, db); err != nil {
		return Summary{}, err
	}
	printSummary(w, s)
	return s, nil
}

// migrate creates the inbox table, the outbox table (and its dead
// letters) in the same database, so payment events commit with the
// charge, and the service's charges table.
func migrate(ctx context.Context, db *sql.DB) (*sqlite.Repository, *outbox.Outbox, error) {
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	if err != nil {
		return nil, nil, err
	}
	if err := repo.Migrate(ctx); err != nil {
		return nil, nil, err
	}
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.SQLite})
	if err != nil {
		return nil, nil, err
	}
	if err := ob.Migrate(ctx, db); err != nil {
		return nil, nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE charges (order_id TEXT NOT NULL, customer TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		return nil, nil, err
	}
	return repo, ob, nil
}

// flow is the service's two handlers, the faults injected around them and
// what they counted.
type flow struct {
	mu                         sync.Mutex
	s                          Summary
	billingAcked, receiptAcked atomic.Int64
	failed, crashed            map[string]bool
}

// router adds billing and receipts, each behind an inbox of its own.
func (f *flow) router(db *sql.DB, repo *sqlite.Repository, ob *outbox.Outbox, pubSub *gochannel.GoChannel, logger watermill.LoggerAdapter) (*message.Router, error) {
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return nil, err
	}
	// One inbox per handler. Both share the SQLite table; their keys are
	// scoped by this service's name and the handler's ("shop/billing",
	// "shop/receipts"), so other services may share the table too.
	// Billing's outputs go to the outbox, bound for "payments", inside its
	// inbox transaction; the router publishes nothing for it.
	billingInbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Outputs: ob.Outputs("payments")})
	if err != nil {
		return nil, err
	}
	receiptsInbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop"})
	if err != nil {
		return nil, err
	}

	// The handler returns its payment event, so it is registered with a
	// publisher; with Outputs the inbox hands the router no messages.
	billing := router.AddHandler("billing", "orders", pubSub, "payments", pubSub, f.bill)
	billing.AddMiddleware(
		acked(&f.billingAcked), // outermost: counts what the broker sees
		f.crashBeforeAck,
		f.classify,
		billingInbox.Middleware,
	)
	receipts := router.AddConsumerHandler("receipts", "payments", pubSub, f.sendReceipt)
	receipts.AddMiddleware(acked(&f.receiptAcked), receiptsInbox.Middleware)
	return router, nil
}

// bill charges an order in the inbox transaction: the charge commits with
// the marker or not at all. The first run for failsOnce fails.
func (f *flow) bill(msg *message.Message) ([]*message.Message, error) {
	var o OrderPlaced
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, err
	}
	if ran, ok := msg.Context().Value(ranKey{}).(*bool); ok {
		*ran = true
	}
	f.mu.Lock()
	fail := o.OrderID == failsOnce && !f.failed[o.OrderID]
	f.failed[o.OrderID] = true
	f.mu.Unlock()

	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
	if err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(msg.Context(), `INSERT INTO charges (order_id, customer, amount_cents) VALUES (?, ?, ?)`,
		o.OrderID, o.Customer, o.Amount); err != nil {
		return nil, err
	}
	if fail {
		return nil, errors.New("card network timeout") // rolls the charge back; the broker redelivers
	}
	payload, _ := json.Marshal(PaymentCompleted(o))
	return []*message.Message{message.NewMessage(watermill.NewUUID(), payload)}, nil
}

// sendReceipt runs only for payments its inbox has not seen before.
func (f *flow) sendReceipt(*message.Message) error {
	f.mu.Lock()
	f.s.ReceiptsSent++
	f.mu.Unlock()
	return nil
}

// acked counts the deliveries a handler acknowledged.
func acked(n *atomic.Int64) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				n.Add(1)
			}
			return out, err
		}
	}
}

// crashBeforeAck is a crash after the inbox committed but before the ack,
// for crashesBeforeAck's first delivery: the router neither publishes the
// payment nor acks the order.
func (f *flow) crashBeforeAck(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil {
			return nil, err
		}
		var o OrderPlaced
		_ = json.Unmarshal(msg.Payload, &o)
		f.mu.Lock()
		defer f.mu.Unlock()
		if o.OrderID == crashesBeforeAck && !f.crashed[o.OrderID] {
			f.crashed[o.OrderID] = true
			f.s.Crashed++
			return nil, errors.New("process crashed before ack")
		}
		return out, nil
	}
}

// classify counts each delivery by what the inbox did with it.
func (f *flow) classify(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ran := new(bool)
		ctx := msg.Context()
		msg.SetContext(context.WithValue(ctx, ranKey{}, ran))
		out, err := h(msg)
		msg.SetContext(ctx)
		f.mu.Lock()
		defer f.mu.Unlock()
		f.s.BillingDeliveries++
		switch {
		case err != nil && *ran:
			f.s.Failed++
		case err != nil:
			return nil, err
		case *ran:
			f.s.Charged++
		default:
			f.s.Duplicates++
			f.s.Replayed += len(out)
		}
		return out, err
	}
}

// produce publishes each order once, some twice (a retry after a lost
// publish confirmation keeps the message UUID).
func (f *flow) produce(pub message.Publisher) error {
	for i, o := range orders {
		payload, _ := json.Marshal(o)
		uuid := fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1)
		copies := 1
		if resentByProducer[o.OrderID] {
			copies = 2
		}
		for range copies {
			if err := pub.Publish("orders", message.NewMessage(uuid, payload)); err != nil {
				return err
			}
			f.s.Published++
		}
	}
	return nil
}

// settle waits until every published order is acked once in the end and
// every order's payment event, which the relay delivers, is acked by
// receipts; then until the outbox is empty (the relay deletes a batch's
// rows after publishing it).
func (f *flow) settle(ctx context.Context, db *sql.DB) error {
	if err := waitUntil(ctx, func() bool {
		return f.billingAcked.Load() == int64(f.s.Published) && f.receiptAcked.Load() == int64(len(orders))
	}); err != nil {
		return fmt.Errorf("waiting for the flow to settle: %w", err)
	}
	if err := waitUntil(ctx, func() bool {
		return db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+outbox.DefaultTableName).Scan(&f.s.OutboxLeft) == nil && f.s.OutboxLeft == 0
	}); err != nil {
		return fmt.Errorf("waiting for the outbox to drain: %w", err)
	}
	return nil
}

// ranKey marks, in a delivery's context, whether the billing handler ran.
type ranKey struct{}

func waitUntil(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

func chargesByCustomer(ctx context.Context, db *sql.DB) (cents, count map[string]int, err error) {
	rows, err := db.QueryContext(ctx, `SELECT customer, SUM(amount_cents), COUNT(*) FROM charges GROUP BY customer`)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	cents, count = map[string]int{}, map[string]int{}
	for rows.Next() {
		var c string
		var sum, n int
		if err := rows.Scan(&c, &sum, &n); err != nil {
			return nil, nil, err
		}
		cents[c], count[c] = sum, n
	}
	return cents, count, rows.Err()
}

func printSummary(w io.Writer, s Summary) {
	resent := s.Published - s.Orders
	fmt.Fprintf(w, "%d orders published as %d messages (%d re-sent by the producer)\n\n", s.Orders, s.Published, resent)
	fmt.Fprintf(w, "billing    %2d deliveries = %d charged + %d failed + %d duplicates\n", s.BillingDeliveries, s.Charged, s.Failed, s.Duplicates)
	fmt.Fprintf(w, "           %2d charged: the handler ran; its charge and its payment event (in the outbox) committed together\n", s.Charged)
	fmt.Fprintf(w, "               %d of them crashed after the commit, before the ack: its payment is in the outbox all the same, the order redelivered\n", s.Crashed)
	fmt.Fprintf(w, "           %2d failed: rolled back, charge and payment event, and redelivered\n", s.Failed)
	fmt.Fprintf(w, "           %2d duplicates acknowledged without charging: %d re-sent by the producer, %d redelivered after the crash\n",
		s.Duplicates, resent, s.Duplicates-resent)
	fmt.Fprintf(w, "               %d replayed a payment event: the outbox holds each charge's, committed with it\n", s.Replayed)
	fmt.Fprintf(w, "payments   %2d published by the relay from the outbox = %d charged; %d rows left in the outbox\n", s.Relayed, s.Charged, s.OutboxLeft)
	fmt.Fprintf(w, "receipts   %2d payment events delivered = %d receipts sent + %d duplicates skipped\n\n", s.PaymentEvents, s.ReceiptsSent, s.ReceiptsSkipped)

	want := map[string]int{}
	wantCount := map[string]int{}
	for _, o := range orders {
		want[o.Customer] += o.Amount
		wantCount[o.Customer]++
	}
	customers := make([]string, 0, len(want))
	for c := range want {
		customers = append(customers, c)
	}
	sort.Strings(customers)
	ok := true
	fmt.Fprintln(w, "customer   orders  charges  charged    expected")
	for _, c := range customers {
		fmt.Fprintf(w, "%-10s %6d  %7d  %8s  %9s\n", c, wantCount[c], s.ChargeCount[c], dollars(s.ChargedCents[c]), dollars(want[c]))
		ok = ok && s.ChargedCents[c] == want[c] && s.ChargeCount[c] == wantCount[c]
	}
	if ok {
		fmt.Fprintln(w, "\nevery order charged exactly once")
	} else {
		fmt.Fprintln(w, "\nMISMATCH: some order was charged more or less than once")
	}
}

func dollars(cents int) string { return fmt.Sprintf("$%d.%02d", cents/100, cents%100) }
