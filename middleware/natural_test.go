package middleware_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	_ "github.com/idemkit/watermill-idempotent/repository/mysql" // registers MySQL's unique-violation numbers
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// outcomeCounter is an Observer counting outcomes.
type outcomeCounter struct {
	mu     sync.Mutex
	counts map[idempotency.Outcome]int
}

func (c *outcomeCounter) ObserveDelivery(_ context.Context, d idempotency.Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[idempotency.Outcome]int{}
	}
	c.counts[d.Outcome]++
}

func (c *outcomeCounter) get(o idempotency.Outcome) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[o]
}

// paymentRecorder is a natural-key handler: the payments row, keyed by
// order id, is the marker; the ledger row is the effect that must happen
// once. It owns its transaction.
type paymentRecorder struct {
	d                dialect
	payments, ledger string
	runs             atomic.Int64
}

func (p *paymentRecorder) Handle(msg *message.Message) (_ []*message.Message, err error) {
	p.runs.Add(1)
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, err
	}
	ctx := msg.Context()
	tx, err := p.d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	// The unique insert goes first: on PostgreSQL a violation aborts the
	// transaction, and nothing after it could run.
	var amount any = o.Amount
	if o.Amount < 0 {
		amount = nil // provokes a NOT NULL violation: an ordinary error
	}
	if _, err := tx.ExecContext(ctx, p.d.q(`INSERT INTO `+p.payments+` (order_id, amount) VALUES (?, ?)`), o.ID, amount); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, p.d.q(`INSERT INTO `+p.ledger+` (order_id, amount) VALUES (?, ?)`), o.ID, o.Amount); err != nil {
		return nil, err
	}
	return nil, tx.Commit()
}

func (p *paymentRecorder) ledgerRows(t *testing.T, orderID string) int {
	t.Helper()
	var n int
	require.NoError(t, p.d.db.QueryRow(p.d.q(`SELECT COUNT(*) FROM `+p.ledger+` WHERE order_id = ?`), orderID).Scan(&n))
	return n
}

func newPaymentRecorder(t *testing.T, d dialect) *paymentRecorder {
	return &paymentRecorder{
		d:        d,
		payments: d.table(t, "payments", `order_id VARCHAR(64) PRIMARY KEY, amount INTEGER NOT NULL`),
		ledger:   d.table(t, "ledger", `order_id VARCHAR(64) NOT NULL, amount INTEGER NOT NULL`),
	}
}

func TestNaturalKeyAcknowledgesUniqueViolationAsDuplicate(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d dialect) {
		p := newPaymentRecorder(t, d)
		counter := &outcomeCounter{}
		h := middleware.NewNaturalKey(middleware.NaturalKeyConfig{Consumer: "payments", Observer: counter}).Middleware(p.Handle)

		msg := orderMessage(watermill.NewUUID(), order{ID: "order-1", Amount: 100})
		for range 3 {
			out, err := h(msg)
			require.NoError(t, err, "a redelivery must be acknowledged")
			require.Empty(t, out)
		}
		// The producer published the same order again under a new UUID:
		// the business key still dedupes it.
		_, err := h(orderMessage(watermill.NewUUID(), order{ID: "order-1", Amount: 100}))
		require.NoError(t, err)

		require.Equal(t, 1, p.ledgerRows(t, "order-1"), "the effect must happen once")
		require.EqualValues(t, 4, p.runs.Load())
		require.Equal(t, 1, counter.get(idempotency.OutcomeProcessed))
		require.Equal(t, 3, counter.get(idempotency.OutcomeDuplicate))

		// Other constraint violations are errors, retried by the broker.
		_, err = h(orderMessage(watermill.NewUUID(), order{ID: "order-2", Amount: -1}))
		require.Error(t, err, "a NOT NULL violation is not a duplicate")
		require.False(t, repository.IsUniqueViolation(err))
		require.Equal(t, 1, counter.get(idempotency.OutcomeFailed))
		require.Equal(t, 0, p.ledgerRows(t, "order-2"))
	})
}

func TestNaturalKeyConcurrentCopiesApplyOnce(t *testing.T) {
	forEachDialect(t, func(t *testing.T, d dialect) {
		p := newPaymentRecorder(t, d)
		counter := &outcomeCounter{}
		h := middleware.NewNaturalKey(middleware.NaturalKeyConfig{Consumer: "payments", Observer: counter}).Middleware(p.Handle)

		const orders, copies = 5, 6
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			errs  []error
			start = make(chan struct{})
		)
		for o := range orders {
			msg := orderMessage(watermill.NewUUID(), order{ID: "order-" + string(rune('a'+o)), Amount: 10})
			for range copies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					if _, err := h(msg.Copy()); err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		require.Empty(t, errs, "every copy is processed or acknowledged as a duplicate")
		for o := range orders {
			require.Equal(t, 1, p.ledgerRows(t, "order-"+string(rune('a'+o))))
		}
		require.Equal(t, orders, counter.get(idempotency.OutcomeProcessed))
		require.Equal(t, orders*(copies-1), counter.get(idempotency.OutcomeDuplicate))
	})
}

func TestNaturalKeyHandlerReportedDuplicate(t *testing.T) {
	h := middleware.NewNaturalKey(middleware.NaturalKeyConfig{}).Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, middleware.ErrNaturalDuplicate
	})
	out, err := h(message.NewMessage(watermill.NewUUID(), nil))
	require.NoError(t, err)
	require.Empty(t, out)
}

// Inside the Inbox the duplicate is not acknowledged: the inbox
// transaction may be unusable. Outside it, the Inbox rolls back and
// NaturalKey acknowledges.
func TestNaturalKeyAndInbox(t *testing.T) {
	db := testenv.SQLite(t)
	d := dialect{name: "sqlite", db: db}
	payments := d.table(t, "payments", `order_id TEXT PRIMARY KEY`)
	inboxTable := randomName("inbox")
	repo, err := sqlite.NewRepository(db, sqlite.Config{Table: inboxTable})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "payments"})
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO ` + payments + ` (order_id) VALUES ('order-1')`)
	require.NoError(t, err)
	handler := func(msg *message.Message) ([]*message.Message, error) {
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(msg.Context(), `INSERT INTO `+payments+` (order_id) VALUES ('order-1')`)
		return nil, err
	}
	natural := middleware.NewNaturalKey(middleware.NaturalKeyConfig{})

	inside := inbox.Middleware(natural.Middleware(handler))
	_, err = inside(message.NewMessage(watermill.NewUUID(), nil))
	require.Error(t, err)
	require.True(t, repository.IsUniqueViolation(err))

	outside := natural.Middleware(inbox.Middleware(handler))
	_, err = outside(message.NewMessage(watermill.NewUUID(), nil))
	require.NoError(t, err)
}
