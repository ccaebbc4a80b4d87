package outbox_test

import (
	"context"
	"database/sql"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	driver "github.com/go-sql-driver/mysql"
	gmmysql "github.com/golang-migrate/migrate/v4/database/mysql"
	gmpgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	gmsqlite "github.com/golang-migrate/migrate/v4/database/sqlite"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// coreChecks runs the outbox's core cases on b's table: committed rows
// are published with UUID, payload and metadata unchanged, rolled-back
// rows never; the outbox is emptied; a row the publisher refuses is
// dead-lettered, listed, requeued and then published.
func coreChecks(t *testing.T, b backend) {
	t.Helper()
	ctx := context.Background()
	msgs := newMessages("core", 3)
	b.write(t, "t", msgs...)
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, b.outbox.WriteTx(ctx, tx, outbox.Outgoing{Topic: "t", Message: message.NewMessage("rolled-back", nil)}))
	require.NoError(t, tx.Rollback())

	s := newSink(t, nil, "t")
	cfg := b.relayConfig()
	cfg.MaxAttempts = 1
	relay, err := b.newRelay(s, cfg, testLogger(t))
	require.NoError(t, err)
	n, err := relay.ForwardBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	got := s.rec.deliveries()
	require.Len(t, got, 3)
	for i, d := range got {
		require.Equal(t, msgs[i].UUID, d.msg.UUID)
		require.Equal(t, msgs[i].Payload, d.msg.Payload)
		require.Equal(t, msgs[i].Metadata, d.msg.Metadata)
	}
	require.Zero(t, b.outboxRows(t))

	b.write(t, "t", message.NewMessage("refused", []byte("x")))
	refusing, err := b.newRelay(&refuseLarge{Publisher: s, limit: 0}, cfg, testLogger(t))
	require.NoError(t, err)
	// The first batch fails and turns isolation on; the second charges
	// the row alone and, at MaxAttempts 1, moves it.
	for range 2 {
		_, err = refusing.ForwardBatch(ctx)
		require.Error(t, err)
	}
	dl := b.deadLetters(t)
	letters, err := dl.List(ctx, outbox.ListParams{})
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, "refused", letters[0].UUID)
	moved, err := dl.Requeue(ctx, letters[0].ID)
	require.NoError(t, err)
	require.Equal(t, 1, moved)
	n, err = relay.ForwardBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.True(t, s.rec.has("refused"))
	require.False(t, s.rec.has("rolled-back"))
	backlog, err := relay.Backlog(ctx)
	require.NoError(t, err)
	require.Equal(t, outbox.Backlog{}, backlog)
}

// TestGolangMigrate: the shipped files, applied by golang-migrate for the
// default table names (in a schema, database or file of the test's own),
// give an outbox that passes the core checks, on database/sql and, on
// PostgreSQL, pgx; Migrate then adopts the tables, running every file
// again harmlessly.
func TestGolangMigrate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: creates schemas and databases")
	}
	check := func(t *testing.T, b backend) {
		b.table = outbox.DefaultTableName
		ob, err := outbox.New(outbox.Config{Dialect: b.dialect})
		require.NoError(t, err)
		b.outbox = ob
		coreChecks(t, b)
		require.NoError(t, ob.Migrate(t.Context(), b.db))
		coreChecks(t, b)
	}
	for _, name := range []string{"postgres", "postgres-pgx"} {
		t.Run(name, func(t *testing.T) {
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
			testenv.GolangMigrate(t, outbox.Migrations, "migrations/postgres", "postgres", drv)

			db, err := sql.Open("pgx", dsn)
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			b := backend{name: name, db: db, dialect: sqldialect.PostgreSQL}
			if name == "postgres-pgx" {
				b.pool, err = pgxpool.New(context.Background(), dsn)
				require.NoError(t, err)
				t.Cleanup(b.pool.Close)
			}
			check(t, b)
		})
	}
	t.Run("mariadb", func(t *testing.T) {
		t.Parallel()
		cfg, err := driver.ParseDSN(testenv.MySQLDatabaseDSN(t, "outbox_gm_"))
		require.NoError(t, err)
		cfg.MultiStatements = true // golang-migrate runs a file in one call
		gmdb, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		drv, err := gmmysql.WithInstance(gmdb, &gmmysql.Config{})
		require.NoError(t, err)
		testenv.GolangMigrate(t, outbox.Migrations, "migrations/mysql", "mysql", drv)
		cfg.MultiStatements = false
		db, err := sql.Open("mysql", cfg.FormatDSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		check(t, backend{name: "mariadb", db: db, dialect: sqldialect.MySQL})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "gm.db")
		gmdb, err := sqlite.Open(path)
		require.NoError(t, err)
		drv, err := gmsqlite.WithInstance(gmdb, &gmsqlite.Config{})
		require.NoError(t, err)
		testenv.GolangMigrate(t, outbox.Migrations, "migrations/sqlite", "sqlite", drv)
		db, err := sqlite.Open(path)
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		check(t, backend{name: "sqlite", db: db, dialect: sqldialect.SQLite})
	})
}

// Pre-release outbox tables (before 0.1.0) had neither attempts nor
// message_bytes (MySQL) nor attempts (PostgreSQL), and no dead-letter
// table. Migrate upgrades one holding a row: the columns and the
// dead-letter table are added, the row is published, and the core checks
// pass.
func TestMigrateUpgradesPreReleaseTable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dialect outbox.Dialect
		ddl     string
	}{
		{"postgres", sqldialect.PostgreSQL, `CREATE TABLE {T} (
    id         BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    topic      VARCHAR(255) NOT NULL,
    uuid       VARCHAR(255) NOT NULL,
    payload    BYTEA        NOT NULL,
    metadata   JSON         NOT NULL,
    created_at TIMESTAMPTZ  NOT NULL DEFAULT CURRENT_TIMESTAMP
)`},
		{"mariadb", sqldialect.MySQL, "CREATE TABLE {T} (" + `
    ` + "`id`         BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY," + `
    ` + "`topic`      VARCHAR(255) NOT NULL," + `
    ` + "`uuid`       VARCHAR(255) NOT NULL," + `
    ` + "`payload`    LONGBLOB     NOT NULL," + `
    ` + "`metadata`   LONGTEXT     NOT NULL," + `
    ` + "`created_at` DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)" + `
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := backend{name: tc.name, dialect: tc.dialect, table: "outbox_old_" + randomSuffix()}
			if tc.dialect == sqldialect.MySQL {
				b.db = testenv.MySQL(t)
			} else {
				b.db = testenv.Postgres(t)
			}
			t.Cleanup(b.drop)
			_, err := b.db.ExecContext(ctx, strings.ReplaceAll(tc.ddl, "{T}", b.table))
			require.NoError(t, err)
			_, err = b.db.ExecContext(ctx, `INSERT INTO `+b.table+` (topic, uuid, payload, metadata) VALUES (`+b.ph(1)+`, `+b.ph(2)+`, `+b.ph(3)+`, `+b.ph(4)+`)`,
				"t", "written-before", []byte("old"), `{"k":"v"}`)
			require.NoError(t, err)

			b.outbox, err = outbox.New(outbox.Config{Dialect: b.dialect, Table: b.table})
			require.NoError(t, err)
			require.NoError(t, b.outbox.Migrate(ctx, b.db))
			require.NoError(t, b.outbox.Migrate(ctx, b.db), "a second run applies nothing")

			s := newSink(t, nil, "t")
			relay, err := b.newRelay(s, b.relayConfig(), testLogger(t))
			require.NoError(t, err)
			n, err := relay.ForwardBatch(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			got := s.rec.deliveries()
			require.Len(t, got, 1)
			require.Equal(t, "written-before", got[0].msg.UUID)
			require.Equal(t, "v", got[0].msg.Metadata.Get("k"))
			coreChecks(t, b)
		})
	}
}
