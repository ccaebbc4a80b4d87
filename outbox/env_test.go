package outbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testLogger writes the relay's errors into the test's output.
func testLogger(t *testing.T) watermill.LoggerAdapter {
	return watermill.NewStdLoggerWithOut(t.Output(), false, false)
}

// backend is one database with a fresh outbox table.
type backend struct {
	name string
	// db reads and checks the tables; on "postgres-pgx" the outbox
	// itself (writes in write, relays, dead letters, Migrate) runs on pool.
	db      *sql.DB
	pool    *pgxpool.Pool
	dialect sqldialect.Dialect
	table   string
	outbox  *outbox.Outbox
}

// ph returns the n-th bind marker of the backend.
func (b backend) ph(n int) string {
	if b.dialect == sqldialect.PostgreSQL {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

func (b backend) relayConfig() outbox.RelayConfig {
	cfg := outbox.RelayConfig{Dialect: b.dialect, Table: b.table, RetryInterval: 20 * time.Millisecond}
	if b.dialect == sqldialect.PostgreSQL && b.pool == nil {
		cfg.Notifier = pgxoutbox.Notifier(b.db)
	}
	return cfg
}

// newRelay is outbox.NewRelay on the backend's driver (pgxoutbox.NewRelay
// on "postgres-pgx", with its pool's LISTEN).
// logger, if set, becomes cfg.Logger.
func (b backend) newRelay(pub message.Publisher, cfg outbox.RelayConfig, logger watermill.LoggerAdapter) (*outbox.Relay, error) {
	if logger != nil {
		cfg.Logger = logger
	}
	if b.pool != nil {
		return pgxoutbox.NewRelay(b.pool, pub, cfg)
	}
	return outbox.NewRelay(b.db, pub, cfg)
}

// newDeadLetters is the dead-letter API on the backend's driver.
func (b backend) newDeadLetters() (*outbox.DeadLetters, error) {
	if b.pool != nil {
		return pgxoutbox.NewDeadLetters(b.pool, b.outbox.Config())
	}
	return b.outbox.DeadLetters(b.db)
}

func randomSuffix() string {
	var buf [5]byte
	_, _ = rand.Read(buf[:])
	return hex.EncodeToString(buf[:])
}

// forEachBackend runs fn as a parallel subtest on PostgreSQL
// (database/sql with the pgx stdlib driver, and pgx natively: "postgres-pgx"),
// MariaDB and SQLite (a fresh database file), each with its own outbox
// table, dropped when the subtest ends.
func forEachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	forEachBackendMode(t, true, fn)
}

func forEachBackendMode(t *testing.T, parallel bool, fn func(t *testing.T, b backend)) {
	t.Helper()
	for _, name := range []string{"postgres", "postgres-pgx", "mariadb", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			b := backend{name: name}
			switch name {
			case "postgres":
				b.db, b.dialect = testenv.Postgres(t), sqldialect.PostgreSQL
			case "postgres-pgx":
				b.db, b.pool, b.dialect = testenv.Postgres(t), testenv.PgxPool(t), sqldialect.PostgreSQL
			case "mariadb":
				b.db, b.dialect = testenv.MySQL(t), sqldialect.MySQL
			default:
				b.db, b.dialect = testenv.SQLite(t), sqldialect.SQLite
			}
			fn(t, b.migrated(t))
		})
	}
}

// forEachPostgresExecMode runs fn as a parallel subtest for each pgx
// query exec mode (testenv.PgxExecModes) on both PostgreSQL backends:
// "postgres/<mode>", database/sql with the mode in the DSN, and
// "postgres-pgx/<mode>", the outbox on a pgxpool.Pool in that mode.
func forEachPostgresExecMode(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	for _, mode := range testenv.PgxExecModes {
		for _, name := range []string{"postgres", "postgres-pgx"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				b := backend{name: name, db: testenv.PostgresInMode(t, mode), dialect: sqldialect.PostgreSQL}
				if name == "postgres-pgx" {
					b.pool = testenv.PgxPoolInMode(t, mode)
				}
				fn(t, b.migrated(t))
			})
		}
	}
}

// migrated gives b a fresh outbox table, migrated on its driver and
// dropped when t ends.
func (b backend) migrated(t *testing.T) backend {
	t.Helper()
	b.table = "outbox_" + randomSuffix()
	b.db.SetMaxOpenConns(20)
	ob, err := outbox.New(outbox.Config{Dialect: b.dialect, Table: b.table})
	require.NoError(t, err)
	if b.pool != nil {
		require.NoError(t, pgxoutbox.Migrate(context.Background(), ob, b.pool))
	} else {
		require.NoError(t, ob.Migrate(context.Background(), b.db))
	}
	b.outbox = ob
	t.Cleanup(b.drop)
	return b
}

// drop drops what Migrate created for b's table: the outbox and
// dead-letter tables and, on PostgreSQL, the NOTIFY trigger's function.
func (b backend) drop() {
	_, _ = b.db.Exec(`DROP TABLE IF EXISTS ` + b.table)
	_, _ = b.db.Exec(`DROP TABLE IF EXISTS ` + outbox.DeadLetterTableName(b.table))
	if b.dialect == sqldialect.PostgreSQL {
		_, _ = b.db.Exec(`DROP FUNCTION IF EXISTS ` + b.table + `_notify()`)
	}
}

func (b backend) outboxRows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow(`SELECT COUNT(*) FROM `+b.table).Scan(&n))
	return n
}

// waitEmpty polls until the relay has acknowledged every row: a message
// is recorded before the relay's commit, so "all delivered" does not yet
// mean "outbox empty".
func (b backend) waitEmpty(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for b.outboxRows(t) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("outbox still holds %d rows after %s", b.outboxRows(t), timeout)
		}
		<-tick.C
	}
}

// write commits msgs to topic in one transaction (a pgx.Tx on
// "postgres-pgx").
func (b backend) write(t testing.TB, topic string, msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, b.tryWrite(topic, msgs...))
}

// tryWrite writes msgs to topic in one transaction (a pgx.Tx on
// "postgres-pgx") and commits it, or rolls it back and returns the error.
func (b backend) tryWrite(topic string, msgs ...*message.Message) error {
	ctx := context.Background()
	out := make([]outbox.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = outbox.Outgoing{Topic: topic, Message: m}
	}
	if b.pool != nil {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return pgxoutbox.WriteTx(ctx, b.outbox, tx, out...)
		})
	}
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := b.outbox.WriteTx(ctx, tx, out...); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

func newMessages(prefix string, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("%s-%04d", prefix, i), []byte{0x0a, byte(i), 0x00, 0xff, byte(i >> 8)})
		msgs[i].Metadata.Set("seq", strconv.Itoa(i))
	}
	return msgs
}

// delivery is one message as a subscriber received it.
type delivery struct {
	topic string
	msg   *message.Message
}

// recorder keeps every delivery, in order, and wakes waiters on change.
type recorder struct {
	mu      sync.Mutex
	all     []delivery
	count   map[string]int
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{count: map[string]int{}, changed: make(chan struct{})}
}

func (r *recorder) add(topic string, m *message.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, delivery{topic, m})
	r.count[m.UUID]++
	close(r.changed)
	r.changed = make(chan struct{})
}

// stats returns deliveries, distinct UUIDs and duplicate deliveries.
func (r *recorder) stats() (deliveries, distinct, duplicates int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.all), len(r.count), len(r.all) - len(r.count)
}

func (r *recorder) has(uuid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count[uuid] > 0
}

func (r *recorder) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.all...)
}

// waitDistinct waits until n distinct UUIDs arrived, failing after timeout.
func (r *recorder) waitDistinct(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		got, ch := len(r.count), r.changed
		r.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out after %s: %d of %d distinct messages delivered", timeout, got, n)
		}
	}
}

// sink is a GoChannel whose Publish returns only after the subscriber
// recorded (and, with a consumer, processed) the message.
type sink struct {
	*gochannel.GoChannel
	rec *recorder
}

// newSink subscribes to topics and passes each message to consume (if not
// nil) before recording and acking it; consume errors nack the message.
func newSink(t *testing.T, consume func(*message.Message) error, topics ...string) *sink {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	s := &sink{GoChannel: gc, rec: newRecorder()}
	var wg sync.WaitGroup
	for _, topic := range topics {
		ch, err := gc.Subscribe(context.Background(), topic)
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range ch {
				if consume != nil {
					if err := consume(m); err != nil {
						m.Nack()
						continue
					}
				}
				s.rec.add(topic, m)
				m.Ack()
			}
		}()
	}
	t.Cleanup(func() {
		_ = gc.Close()
		wg.Wait()
	})
	return s
}

// runRelay runs relay in the background until the test ends.
func runRelay(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- relay.Run(context.Background()) }()
	t.Cleanup(func() {
		require.NoError(t, relay.Close())
		require.NoError(t, <-done)
	})
}

// consumerInbox is a downstream consumer with an inbox: its handler
// records one effect row per processed message, in the inbox transaction,
// in a table without a unique constraint, so a duplicate effect would show.
type consumerInbox struct {
	db      *sql.DB
	effects string
	ph      func(int) string
	inbox   *middleware.Inbox
}

// newConsumerInbox puts the inbox on PostgreSQL for the postgres backend
// and on SQLite otherwise.
func newConsumerInbox(t *testing.T, b backend) *consumerInbox {
	t.Helper()
	ctx := context.Background()
	c := &consumerInbox{effects: "effects_" + randomSuffix()}
	var repo repository.Driver[*sql.Tx]
	inboxTable := "inbox_" + randomSuffix()
	if b.dialect == sqldialect.PostgreSQL {
		c.db, c.ph = b.db, b.ph
		r, err := postgres.NewRepository(b.db, postgres.Config{Table: inboxTable})
		require.NoError(t, err)
		require.NoError(t, r.Migrate(ctx))
		repo = r
		t.Cleanup(func() { _, _ = b.db.Exec(`DROP TABLE ` + inboxTable) })
	} else {
		c.db, c.ph = testenv.SQLite(t), func(int) string { return "?" }
		r, err := sqlite.NewRepository(c.db, sqlite.Config{Table: inboxTable})
		require.NoError(t, err)
		require.NoError(t, r.Migrate(ctx))
		repo = r
	}
	_, err := c.db.Exec(`CREATE TABLE ` + c.effects + ` (uuid VARCHAR(255) NOT NULL)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = c.db.Exec(`DROP TABLE ` + c.effects) })
	c.inbox, err = middleware.NewInbox(repo, middleware.Config{Consumer: "outbox-test"})
	require.NoError(t, err)
	return c
}

func (c *consumerInbox) handler(msg *message.Message) ([]*message.Message, error) {
	tx, txErr := idempotency.Tx[*sql.Tx](msg.Context())
	if txErr != nil {
		return nil, txErr
	}
	_, err := tx.ExecContext(msg.Context(), `INSERT INTO `+c.effects+` (uuid) VALUES (`+c.ph(1)+`)`, msg.UUID)
	return nil, err
}

// consume runs the handler behind the inbox.
func (c *consumerInbox) consume(msg *message.Message) error {
	_, err := c.inbox.Middleware(c.handler)(msg)
	return err
}

func (c *consumerInbox) effectCount(t *testing.T) (rows, distinct int) {
	t.Helper()
	require.NoError(t, c.db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT uuid) FROM `+c.effects).Scan(&rows, &distinct))
	return rows, distinct
}

// forEachBackendSequential is forEachBackend without t.Parallel, for
// tests that measure the process.
func forEachBackendSequential(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	forEachBackendMode(t, false, fn)
}

func getenvInt(t *testing.T, name string) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, name)
	return n
}

// splitBatch hands a relay's report to two functions, as the relay's two
// hooks reported it before RelayObserver: forwarded gets a batch that
// claimed rows (Relay and Err cleared), failed the error of a failed one.
func splitBatch(b outbox.RelayBatch, forwarded func(outbox.RelayBatch), failed func(error)) {
	err := b.Err
	b.Relay, b.Err = "", nil
	if b.Claimed > 0 {
		forwarded(b)
	}
	if err != nil {
		failed(err)
	}
}
