package middleware_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// store is one backend with its own inbox table and business tables.
type store struct {
	name    string
	db      *sql.DB
	inbox   string // inbox table
	charges string // business table: one row per charge, deliberately without a unique constraint
	// repo is the backend's database/sql repository on the inbox table
	// (on the pgx store too, where it only reads and sets up).
	repo        sqlRepo
	placeholder func(n int) string
	// pool and pgxRepo are set on the pgx store: the inbox runs on
	// postgres.NewPgxRepository and the handler writes through the pgx.Tx.
	pool    *pgxpool.Pool
	pgxRepo *postgres.Repository[pgx.Tx]
}

// sqlRepo is a database/sql repository: the inbox's driver and the
// two-phase inbox's repository.
type sqlRepo interface {
	repository.Driver[*sql.Tx]
	repository.TwoPhase
}

// withPgx names every store plus the opt-in pgx one (PostgreSQL with the
// inbox transaction on pgxpool), for forEachStore.
var withPgx = []string{"postgres", "postgres-pgx", "sqlite", "mysql"}

// forEachStore runs fn as a parallel subtest per backend (or per named
// backend, postgres-pgx only when named), each on fresh tables.
func forEachStore(t *testing.T, fn func(t *testing.T, s *store), only ...string) {
	for _, b := range []struct {
		name string
		open func(testing.TB) *store
	}{{"postgres", newPostgresStore}, {"postgres-pgx", newPgxStore}, {"sqlite", newSQLiteStore}, {"mysql", newMySQLStore}} {
		if (len(only) > 0 || b.name == "postgres-pgx") && !slices.Contains(only, b.name) {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b.open(t))
		})
	}
}

// forEachPostgresMode runs fn as a parallel subtest for each pgx query
// exec mode (testenv.PgxExecModes) on both PostgreSQL stores, each on
// fresh tables: "postgres/<mode>", database/sql with the mode in the DSN,
// and "postgres-pgx/<mode>", the inbox on a pgxpool.Pool in that mode.
func forEachPostgresMode(t *testing.T, fn func(t *testing.T, s *store)) {
	for _, mode := range testenv.PgxExecModes {
		for _, b := range []struct {
			name string
			open func(testing.TB, string) *store
		}{{"postgres", newPostgresStoreInMode}, {"postgres-pgx", newPgxStoreInMode}} {
			t.Run(b.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				fn(t, b.open(t, mode))
			})
		}
	}
}

func newPostgresStore(t testing.TB) *store { return newPostgresStoreOn(t, testenv.Postgres(t)) }

// newPostgresStoreInMode is newPostgresStore in a pgx query exec mode.
func newPostgresStoreInMode(t testing.TB, mode string) *store {
	return newPostgresStoreOn(t, testenv.PostgresInMode(t, mode))
}

// newPostgresStoreOn is newPostgresStore on a database the test opened.
func newPostgresStoreOn(t testing.TB, db *sql.DB) *store {
	s := &store{name: "postgres", db: db, inbox: randomName("inbox"), charges: randomName("charges"),
		placeholder: func(n int) string { return fmt.Sprintf("$%d", n) }}
	repo, err := postgres.NewRepository(db, postgres.Config{Table: s.inbox})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	s.repo = repo
	s.setup(t)
	return s
}

// newPgxStore is PostgreSQL with the repository and the inbox transaction
// on a pgxpool.Pool; db (database/sql) only sets up and checks tables.
func newPgxStore(t testing.TB) *store {
	return newPgxStoreOn(t, newPostgresStore(t), testenv.PgxPool(t))
}

// newPgxStoreInMode is newPgxStore with both pools in a pgx query exec
// mode.
func newPgxStoreInMode(t testing.TB, mode string) *store {
	return newPgxStoreOn(t, newPostgresStoreInMode(t, mode), testenv.PgxPoolInMode(t, mode))
}

// newPgxStoreOn turns the PostgreSQL store s into the pgx one on pool.
func newPgxStoreOn(t testing.TB, s *store, pool *pgxpool.Pool) *store {
	s.pool = pool
	repo, err := postgres.NewPgxRepository(s.pool, postgres.Config{Table: s.inbox})
	require.NoError(t, err)
	s.pgxRepo = repo
	return s
}

func newSQLiteStore(t testing.TB) *store {
	db := testenv.SQLite(t)
	s := &store{name: "sqlite", db: db, inbox: randomName("inbox"), charges: randomName("charges"),
		placeholder: func(int) string { return "?" }}
	repo, err := sqlite.NewRepository(db, sqlite.Config{Table: s.inbox})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	s.repo = repo
	s.setup(t)
	return s
}

func (s *store) setup(t testing.TB) {
	_, err := s.db.Exec(`CREATE TABLE ` + s.charges + ` (order_id TEXT NOT NULL, amount INTEGER NOT NULL)`)
	require.NoError(t, err)
	// A constraint checked only at COMMIT, to make commits fail on demand
	// (InnoDB has none: failCommit kills the connection instead).
	switch s.name {
	case "mysql":
		_, err = s.db.Exec(`CREATE TABLE ` + s.charges + `_commit_check (id TEXT)`)
	case "postgres":
		_, err = s.db.Exec(`CREATE TABLE ` + s.charges + `_commit_check (id TEXT, CONSTRAINT ` + s.charges + `_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)`)
	default:
		_, err = s.db.Exec(`CREATE TABLE ` + s.charges + `_parent (id TEXT PRIMARY KEY)`)
		require.NoError(t, err)
		_, err = s.db.Exec(`CREATE TABLE ` + s.charges + `_commit_check (id TEXT REFERENCES ` + s.charges + `_parent (id) DEFERRABLE INITIALLY DEFERRED)`)
	}
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, table := range []string{s.inbox, s.charges, s.charges + "_commit_check", s.charges + "_parent"} {
			_, err := s.db.Exec(`DROP TABLE IF EXISTS ` + table)
			require.NoError(t, err)
		}
	})
}

// q rewrites "?" placeholders for the backend.
func (s *store) q(query string) string {
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString(s.placeholder(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// execInTx runs query ("?" placeholders) in the inbox transaction of the
// delivery whose context is ctx: the pgx.Tx on the pgx store, the *sql.Tx
// on the others.
func (s *store) execInTx(ctx context.Context, query string, args ...any) error {
	if s.pool != nil {
		tx, txErr := idempotency.Tx[pgx.Tx](ctx)
		if txErr != nil {
			return errors.New("no pgx inbox transaction in the context")
		}
		_, err := tx.Exec(ctx, s.q(query), args...)
		return err
	}
	tx, txErr := idempotency.Tx[*sql.Tx](ctx)
	if txErr != nil {
		return errors.New("no inbox transaction in the context")
	}
	_, err := tx.ExecContext(ctx, s.q(query), args...)
	return err
}

// chargesFor returns how many times the order was charged.
func (s *store) chargesFor(t *testing.T, orderID string) int {
	t.Helper()
	var n int
	require.NoError(t, s.db.QueryRow(s.q(`SELECT COUNT(*) FROM `+s.charges+` WHERE order_id = ?`), orderID).Scan(&n))
	return n
}

// totalCharges returns the number of charge rows.
func (s *store) totalCharges(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, s.db.QueryRow(`SELECT COUNT(*) FROM `+s.charges).Scan(&n))
	return n
}

// failCommit makes the current transaction fail at COMMIT: a deferred
// constraint on PostgreSQL and SQLite; on MySQL the database goes away
// under the transaction (its connection is killed).
func (s *store) failCommit(ctx context.Context, tx *sql.Tx) error {
	if s.name == "mysql" {
		var id int64
		if err := tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id); err != nil {
			return err
		}
		_, err := s.db.ExecContext(ctx, fmt.Sprintf(`KILL CONNECTION %d`, id))
		return err
	}
	if s.name == "postgres" {
		_, err := tx.ExecContext(ctx, `INSERT INTO `+s.charges+`_commit_check (id) VALUES ('x'), ('x')`)
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO `+s.charges+`_commit_check (id) VALUES ('no-such-parent')`)
	return err
}

func (s *store) newInbox(t testing.TB, consumer string, mutate ...func(*middleware.Config)) *middleware.Inbox {
	t.Helper()
	c := middleware.Config{Consumer: consumer, Logger: watermill.NopLogger{}}
	for _, m := range mutate {
		m(&c)
	}
	inbox, err := s.inboxWith(c)
	require.NoError(t, err)
	return inbox
}

// leaseRepo is the store's repository for the two-phase inbox: the pgx
// one on the pgx store.
func (s *store) leaseRepo() leaseRepo {
	if s.pgxRepo != nil {
		return s.pgxRepo
	}
	return s.repo
}

// inboxWith is middleware.NewInbox on the store's driver: the pgx
// repository on the pgx store, the database/sql one elsewhere.
func (s *store) inboxWith(c middleware.Config) (*middleware.Inbox, error) {
	if s.pgxRepo != nil {
		return middleware.NewInbox(s.pgxRepo, c)
	}
	return middleware.NewInbox(s.repo, c)
}

// order is the test domain's event payload.
type order struct {
	ID     string `json:"order_id"`
	Amount int    `json:"amount"`
}

func orderMessage(uuid string, o order) *message.Message {
	payload, err := json.Marshal(o)
	if err != nil {
		panic(err)
	}
	return message.NewMessage(uuid, payload)
}

// chargeHandler charges the order through the inbox transaction and emits
// a payment-completed message with a fresh UUID. It counts its runs.
type chargeHandler struct {
	s    *store
	runs atomic.Int64
	// before, if set, runs after the charge is written, inside the same
	// transaction, and can fail the run (tx is nil on the pgx store).
	before func(msg *message.Message, tx *sql.Tx) error
}

func (h *chargeHandler) Handle(msg *message.Message) (_ []*message.Message, err error) {
	h.runs.Add(1)
	if h.s.pool != nil {
		return h.handlePgx(msg)
	}
	tx, txErr := idempotency.Tx[*sql.Tx](msg.Context())
	if txErr != nil {
		// Without the inbox (the Deduplicator comparison) the handler
		// commits its own transaction, as a plain handler would.
		if tx, err = h.s.db.BeginTx(msg.Context(), nil); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = tx.Rollback()
				return
			}
			err = tx.Commit()
		}()
	}
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(msg.Context(), h.s.q(`INSERT INTO `+h.s.charges+` (order_id, amount) VALUES (?, ?)`), o.ID, o.Amount); err != nil {
		return nil, err
	}
	if h.before != nil {
		if err := h.before(msg, tx); err != nil {
			return nil, err
		}
	}
	out := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+o.ID+`","status":"paid"}`))
	out.Metadata.Set("order_id", o.ID)
	return []*message.Message{out}, nil
}

// handlePgx is Handle on the pgx inbox transaction.
func (h *chargeHandler) handlePgx(msg *message.Message) ([]*message.Message, error) {
	tx, txErr := idempotency.Tx[pgx.Tx](msg.Context())
	if txErr != nil {
		return nil, errors.New("no pgx inbox transaction in the context")
	}
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, err
	}
	if _, err := tx.Exec(msg.Context(), `INSERT INTO `+h.s.charges+` (order_id, amount) VALUES ($1, $2)`, o.ID, o.Amount); err != nil {
		return nil, err
	}
	if h.before != nil {
		if err := h.before(msg, nil); err != nil {
			return nil, err
		}
	}
	out := message.NewMessage(watermill.NewUUID(), []byte(`{"order_id":"`+o.ID+`","status":"paid"}`))
	out.Metadata.Set("order_id", o.ID)
	return []*message.Message{out}, nil
}

func randomName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

func newMySQLStore(t testing.TB) *store {
	db := testenv.MySQL(t)
	s := &store{name: "mysql", db: db, inbox: randomName("inbox"), charges: randomName("charges"),
		placeholder: func(int) string { return "?" }}
	repo, err := mysql.NewRepository(db, mysql.Config{Table: s.inbox})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	s.repo = repo
	s.setup(t)
	return s
}
