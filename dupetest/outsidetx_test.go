package dupetest_test

import (
	"database/sql"
	"fmt"
	"regexp"
	"testing"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/dupetest"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// orders is a business table with one row per handled order and no
// unique constraint, so a handler that runs twice leaves two rows.
type orders struct {
	db    *sql.DB
	table string
}

func newOrders(t *testing.T, db *sql.DB) orders {
	o := orders{db: db, table: backends.RandomName("dupetest_orders")}
	_, err := db.Exec(`CREATE TABLE ` + o.table + ` (order_id TEXT NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + o.table) })
	return o
}

// insertWithDB is the mistake: it writes with the *sql.DB, outside the
// inbox's transaction.
func (o orders) insertWithDB(msg *message.Message) error {
	_, err := o.db.ExecContext(msg.Context(), `INSERT INTO `+o.table+` (order_id) VALUES ($1)`, orderID(msg))
	return err
}

// insertWithTx writes with the inbox's transaction.
func (o orders) insertWithTx(msg *message.Message) error {
	tx, txErr := idempotency.Tx[*sql.Tx](msg.Context())
	if txErr != nil {
		return txErr
	}
	_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+o.table+` (order_id) VALUES ($1)`, orderID(msg))
	return err
}

// rows is Config.State: the order's rows, read with the *sql.DB.
func (o orders) rows(msg *message.Message) (any, error) {
	var n int
	err := o.db.QueryRowContext(msg.Context(), `SELECT count(*) FROM `+o.table+` WHERE order_id = $1`, orderID(msg)).Scan(&n)
	return n, err
}

func (o orders) count(t *testing.T, id string) int {
	var n int
	require.NoError(t, o.db.QueryRow(`SELECT count(*) FROM `+o.table+` WHERE order_id = $1`, id).Scan(&n))
	return n
}

// orderID is the order a message is about: its order_id metadata, or
// its UUID.
func orderID(msg *message.Message) string {
	if id := msg.Metadata.Get("order_id"); id != "" {
		return id
	}
	return msg.UUID
}

// The case of issue 38: a handler behind the inbox writes its row with
// the *sql.DB and fails once after writing. On a router with the
// redelivery that follows, it leaves two rows per order; the injector
// names each message whose row survived the rollback. The same handler
// writing with the inbox's transaction passes: one row per order.
func TestStateCatchesAWriteOutsideTheTransaction(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handle  func(orders) message.NoPublishHandlerFunc
		outside bool
	}{
		{"writes with db", func(o orders) message.NoPublishHandlerFunc { return o.insertWithDB }, true},
		{"writes with the tx", func(o orders) message.NoPublishHandlerFunc { return o.insertWithTx }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := backends.Open(t, "postgres")
			o := newOrders(t, st.DB)
			inbox, err := middleware.NewInbox(st.SQL, middleware.Config{Consumer: "orders"})
			require.NoError(t, err)

			dupes := dupetest.New(dupetest.Config{Seed: 1, FailFirst: 1, Inbox: inbox.Middleware, State: o.rows})
			const n = 10
			runPayments(t, n, tc.handle(o), dupes) // every first attempt fails inside the inbox, then is redelivered

			stats := dupes.Stats()
			require.Equal(t, n, stats.FailedFirst)
			require.Empty(t, stats.CopyErrors)
			if !tc.outside {
				require.Empty(t, stats.RollbackErrors)
				for i := range n {
					require.Equal(t, 1, o.count(t, fmt.Sprintf("payment-%d", i)), "payment-%d", i)
				}
				return
			}
			require.Len(t, stats.RollbackErrors, n, "one finding per failed first attempt")
			named := map[string]int{}
			for _, err := range stats.RollbackErrors {
				require.ErrorIs(t, err, dupetest.ErrOutsideTx)
				require.Contains(t, err.Error(), "State was 0 before the attempt and 1 after the rollback")
				require.Contains(t, err.Error(), "write with idempotency.Tx[*sql.Tx](msg.Context()), not with the *sql.DB")
				m := messageNamed.FindStringSubmatch(err.Error())
				require.NotNil(t, m, err.Error())
				named[m[1]]++
			}
			for i := range n {
				id := fmt.Sprintf("payment-%d", i)
				require.Equal(t, 1, named[id], "findings naming %s", id)
				require.Equal(t, 2, o.count(t, id), "the row of the rolled-back attempt and the redelivery's: the harm the finding names")
			}
			t.Logf("the message the user sees:\n%v", stats.RollbackErrors[0])
		})
	}
}

var messageNamed = regexp.MustCompile(`^dupetest: the handler's effect survived a rollback of the inbox transaction \(message (payment-\d+)\): `)

// Called on a handler directly, the failed attempt returns the finding,
// naming the message and the inbox's key when it is not the UUID.
func TestStateErrorNamesTheMessageAndKey(t *testing.T) {
	st := backends.Open(t, "postgres")
	o := newOrders(t, st.DB)
	inbox, err := middleware.NewInbox(st.SQL, middleware.Config{Consumer: "orders", Key: middleware.MetadataKey("order_id")})
	require.NoError(t, err)
	// Every message copied at once: the copy is the redelivery.
	dupes := dupetest.New(dupetest.Config{Fraction: 1, Late: -1, FailFirst: 1, Inbox: inbox.Middleware, State: o.rows})
	handle := dupes.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		return nil, o.insertWithDB(msg)
	})

	msg := message.NewMessage("3b2f0c1e-msg", []byte(`{"total":12}`))
	msg.Metadata.Set("order_id", "order-7")
	_, err = handle(msg)
	require.EqualError(t, err, `dupetest: the handler's effect survived a rollback of the inbox transaction `+
		`(message 3b2f0c1e-msg, key "order-7"): State was 0 before the attempt and 1 after the rollback, `+
		`so the handler writes outside the inbox's transaction and every redelivery after a failure repeats its effect; `+
		`write with idempotency.Tx[*sql.Tx](msg.Context()), not with the *sql.DB`)
	require.ErrorIs(t, err, dupetest.ErrOutsideTx)
	stats := dupes.Stats()
	require.Equal(t, []error{err}, stats.RollbackErrors)
	require.Empty(t, stats.CopyErrors)
	require.Equal(t, 2, o.count(t, "order-7"), "the copy ran the handler again after the rollback: what the finding warns about")

	_, err = handle(msg.Copy()) // another redelivery: a duplicate now
	require.NoError(t, err)
	require.Equal(t, 2, o.count(t, "order-7"))
	require.Len(t, dupes.Stats().RollbackErrors, 1)
}

func TestStateNeedsInboxAndFailFirst(t *testing.T) {
	state := func(*message.Message) (any, error) { return 0, nil }
	inbox := func(h message.HandlerFunc) message.HandlerFunc { return h }

	err := dupetest.Config{State: state, FailFirst: 1}.Validate()
	require.ErrorContains(t, err, "config.State needs config.Inbox")
	err = dupetest.Config{State: state, Inbox: inbox}.Validate()
	require.ErrorContains(t, err, "set config.FailFirst above 0, got 0")
	require.NoError(t, dupetest.Config{State: state, Inbox: inbox, FailFirst: 0.1}.Validate())
	require.NoError(t, dupetest.Config{Inbox: inbox}.Validate(), "Inbox alone: failures inside it, no check")
}
