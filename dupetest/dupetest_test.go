package dupetest_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/watermill-idempotent/dupetest"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// account is the state a payment handler changes: credit adds to the
// balance, which is not idempotent by itself.
type account struct {
	db    *sql.DB
	table string
}

func newAccount(t *testing.T, st *backends.Store) account {
	a := account{db: st.DB, table: backends.RandomName("account")}
	_, err := a.db.Exec(`CREATE TABLE ` + a.table + ` (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)`)
	require.NoError(t, err)
	_, err = a.db.Exec(`INSERT INTO ` + a.table + ` (id, balance) VALUES (1, 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = a.db.Exec(`DROP TABLE IF EXISTS ` + a.table) })
	return a
}

func (a account) balance(t *testing.T) int {
	var b int
	require.NoError(t, a.db.QueryRow(`SELECT balance FROM `+a.table+` WHERE id = 1`).Scan(&b))
	return b
}

// credit adds the payload's amount. Behind the inbox it writes through
// the inbox transaction; without it, straight to the database.
func (a account) credit(msg *message.Message) ([]*message.Message, error) {
	amount, err := strconv.Atoi(string(msg.Payload))
	if err != nil {
		return nil, err
	}
	var exec interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	} = a.db
	if tx, err := idempotency.Tx[*sql.Tx](msg.Context()); err == nil {
		exec = tx
	}
	_, err = exec.ExecContext(msg.Context(), `UPDATE `+a.table+` SET balance = balance + `+strconv.Itoa(amount)+` WHERE id = 1`)
	return nil, err
}

func (a account) handle(msg *message.Message) error {
	_, err := a.credit(msg)
	return err
}

// runPayments publishes n credits of 1 through a router with the given
// middleware and waits until every message was acknowledged and every
// late copy delivered.
func runPayments(t *testing.T, n int, handler message.NoPublishHandlerFunc, dupes *dupetest.Injector, mw ...message.HandlerMiddleware) {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: int64(n), Persistent: true}, logger)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)

	var mu sync.Mutex
	acked := map[string]bool{}
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil {
				mu.Lock()
				acked[msg.UUID] = true
				mu.Unlock()
			}
			return out, err
		}
	}
	router.AddMiddleware(count, dupes.Middleware) // ← the one line a handler test adds
	router.AddMiddleware(mw...)
	router.AddConsumerHandler("payments", "credits", pubSub, handler)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	<-router.Running()
	for i := range n {
		require.NoError(t, pubSub.Publish("credits", message.NewMessage(fmt.Sprintf("payment-%d", i), []byte("1"))))
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) == n
	}, 30*time.Second, 5*time.Millisecond)
	dupes.Wait()
	cancel()
	require.NoError(t, <-done)
	require.NoError(t, pubSub.Close())
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInjectorCatchesNonIdempotentHandler(t *testing.T) {
	st := backends.Open(t, "sqlite")
	acct := newAccount(t, st)

	dupes := dupetest.New(dupetest.Config{Seed: 42, Fraction: 0.5, FailFirst: 0.2})
	const n = 40
	runPayments(t, n, acct.handle, dupes)

	stats := dupes.Stats()
	got := acct.balance(t)
	t.Logf("without the inbox: %d payments of 1, balance %d (copies: %d immediate, %d late; %d first attempts failed)",
		n, got, stats.Immediate, stats.Late, stats.FailedFirst)
	require.Greater(t, stats.Immediate+stats.Late+stats.FailedFirst, 0)
	require.Equal(t, n+stats.Immediate+stats.Late+stats.FailedFirst, got,
		"every copy and every redelivery credited again: the handler is not idempotent")
	require.NotEqual(t, n, got, "the injector must catch the non-idempotent handler")
}

func TestInjectorPassesWithTheInbox(t *testing.T) {
	for _, name := range backends.SQLNames {
		t.Run(name, func(t *testing.T) {
			st := backends.Open(t, name)
			acct := newAccount(t, st)
			inbox, err := middleware.NewInbox(st.SQL, middleware.Config{Consumer: "payments"})
			require.NoError(t, err)

			dupes := dupetest.New(dupetest.Config{Seed: 42, Fraction: 0.5, FailFirst: 0.2})
			const n = 40
			runPayments(t, n, acct.handle, dupes, inbox.Middleware)

			stats := dupes.Stats()
			require.Greater(t, stats.Immediate+stats.Late+stats.FailedFirst, 0)
			require.Empty(t, stats.CopyErrors)
			require.Equal(t, n, acct.balance(t), "with the inbox every payment counts once")
		})
	}
}

// The same seed makes the same decisions for messages arriving in the
// same order.
func TestInjectorIsDeterministic(t *testing.T) {
	run := func(seed uint64) (dupetest.Stats, []string) {
		dupes := dupetest.New(dupetest.Config{Seed: seed, Fraction: 0.5, Late: 0.5, FailFirst: 0.3, MaxDelay: time.Millisecond})
		var mu sync.Mutex
		var seen []string
		h := dupes.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			seen = append(seen, msg.UUID)
			mu.Unlock()
			return nil, nil
		})
		var failed []string
		for i := range 100 {
			msg := message.NewMessage(strconv.Itoa(i), nil)
			if _, err := h(msg); err != nil {
				require.ErrorIs(t, err, dupetest.ErrInjected)
				failed = append(failed, msg.UUID)
			}
		}
		dupes.Wait()
		s := dupes.Stats()
		require.Equal(t, 100+s.Immediate+s.Late, len(seen))
		return s, failed
	}
	a, failedA := run(7)
	b, failedB := run(7)
	c, failedC := run(8)
	require.Equal(t, a, b)
	require.Equal(t, failedA, failedB)
	require.NotEqual(t, failedA, failedC, "another seed, other decisions")
	require.Equal(t, 100, a.Messages)
	require.InDelta(t, 50, a.Immediate+a.Late, 15)
	require.InDelta(t, 30, a.FailedFirst, 15)
	_ = c
}
