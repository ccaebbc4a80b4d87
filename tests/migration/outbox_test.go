package migration_test

import (
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	driver "github.com/go-sql-driver/mysql"
	gmmysql "github.com/golang-migrate/migrate/v4/database/mysql"
	gmpgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	gmsqlite "github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
	"github.com/idemkit/watermill-idempotent/tests/migration"
)

// TestOutboxGolangMigrate: the outbox's shipped files, applied by
// golang-migrate for the default table names (in a schema, database or
// file of the test's own), give an outbox that publishes committed rows
// unchanged, never rolled-back ones, and dead-letters and requeues a row
// the publisher refuses; Migrate then adopts the tables, running every
// file again harmlessly, and the outbox still works.
func TestOutboxGolangMigrate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: creates schemas and databases")
	}
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		dsn := testenv.PostgresSchemaDSN(t, "outbox_gm_")
		u, err := url.Parse(dsn)
		require.NoError(t, err)
		schema := u.Query().Get("search_path")
		require.NotEmpty(t, schema)
		gmdb, err := sql.Open("pgx", dsn)
		require.NoError(t, err)
		drv, err := gmpgx.WithInstance(gmdb, &gmpgx.Config{SchemaName: schema})
		require.NoError(t, err)
		migration.GolangMigrate(t, outbox.Migrations, "migrations/postgres", "postgres", drv)
		db, err := sql.Open("pgx", dsn)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		checkOutboxAdopted(t, db, postgres.Dialect)
	})
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		cfg, err := driver.ParseDSN(testenv.MySQLDatabaseDSN(t, "outbox_gm_"))
		require.NoError(t, err)
		cfg.MultiStatements = true // golang-migrate runs a file in one call
		gmdb, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		drv, err := gmmysql.WithInstance(gmdb, &gmmysql.Config{})
		require.NoError(t, err)
		migration.GolangMigrate(t, outbox.Migrations, "migrations/mysql", "mysql", drv)
		cfg.MultiStatements = false
		db, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		checkOutboxAdopted(t, db, mysql.Dialect)
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "gm.db")
		gmdb, err := sqlite.Open(path)
		require.NoError(t, err)
		drv, err := gmsqlite.WithInstance(gmdb, &gmsqlite.Config{})
		require.NoError(t, err)
		migration.GolangMigrate(t, outbox.Migrations, "migrations/sqlite", "sqlite", drv)
		db, err := sqlite.Open(path)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		checkOutboxAdopted(t, db, sqlite.Dialect)
	})
}

// checkOutboxAdopted runs the outbox's core cases on the default tables
// golang-migrate created in db, lets Migrate adopt them, and runs the
// cases again.
func checkOutboxAdopted(t *testing.T, db *sql.DB, d sqldialect.Dialect) {
	ob, err := outbox.New(outbox.Config{Dialect: d})
	require.NoError(t, err)
	outboxWorks(t, db, ob, "before")
	require.NoError(t, ob.Migrate(t.Context(), db))
	outboxWorks(t, db, ob, "adopted")
}

// outboxWorks writes two messages in a committed transaction and one in a
// rolled-back one, relays them, and checks that exactly the committed two
// arrive unchanged; then a message the publisher refuses is
// dead-lettered, requeued and published.
func outboxWorks(t *testing.T, db *sql.DB, ob *outbox.Outbox, prefix string) {
	t.Helper()
	ctx := t.Context()
	write := func(commit bool, msgs ...*message.Message) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		for _, m := range msgs {
			require.NoError(t, ob.WriteTx(ctx, tx, outbox.Outgoing{Topic: "t", Message: m}))
		}
		if commit {
			require.NoError(t, tx.Commit())
		} else {
			require.NoError(t, tx.Rollback())
		}
	}
	sent := []*message.Message{message.NewMessage(prefix+"-1", []byte{0x00, 0xff}), message.NewMessage(prefix+"-2", []byte("{}"))}
	sent[0].Metadata.Set("k", "v")
	write(true, sent...)
	write(false, message.NewMessage(prefix+"-rolled-back", nil))

	pub := &recorder{}
	cfg := outbox.RelayConfig{Dialect: ob.Config().Dialect, MaxAttempts: 1, Logger: watermill.NewStdLoggerWithOut(t.Output(), false, false)}
	relay, err := outbox.NewRelay(db, pub, cfg)
	require.NoError(t, err)
	n, err := relay.ForwardBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	got := pub.received()
	require.Len(t, got, 2)
	for i, m := range got {
		require.Equal(t, sent[i].UUID, m.UUID)
		require.Equal(t, sent[i].Payload, m.Payload)
		require.Equal(t, sent[i].Metadata, m.Metadata)
	}

	write(true, message.NewMessage(prefix+"-refused", nil))
	refusing, err := outbox.NewRelay(db, &recorder{refuse: true}, cfg)
	require.NoError(t, err)
	dl, err := ob.DeadLetters(db)
	require.NoError(t, err)
	var letters []outbox.DeadLetter
	// A failed batch turns isolation on; a later one charges the row
	// alone and, at MaxAttempts 1, moves it.
	for range 5 {
		_, err = refusing.ForwardBatch(ctx)
		require.Error(t, err)
		letters, err = dl.List(ctx, outbox.ListParams{})
		require.NoError(t, err)
		if len(letters) > 0 {
			break
		}
	}
	require.Len(t, letters, 1)
	require.Equal(t, prefix+"-refused", letters[0].UUID)
	moved, err := dl.Requeue(ctx, letters[0].ID)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	n, err = relay.ForwardBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, prefix+"-refused", pub.received()[2].UUID)
	backlog, err := relay.Backlog(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Backlog{}, backlog)
}

// recorder is a message.Publisher that keeps what it is given, or
// refuses everything for good (outbox.Permanent).
type recorder struct {
	refuse bool
	mu     sync.Mutex
	msgs   []*message.Message
}

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	if r.refuse {
		return outbox.Permanent(errors.New("refused"))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, msgs...)
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) received() []*message.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*message.Message(nil), r.msgs...)
}
