package health_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/watermill-idempotent/health"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func suffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// get calls h and decodes its answer.
func get(t *testing.T, h http.Handler) (int, health.Response) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	var r health.Response
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &r), rec.Body.String())
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	return rec.Code, r
}

// eventually polls h until its code is want, with a deadline.
func eventually(t *testing.T, h http.Handler, want int) health.Response {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, r := get(t, h)
		if code == want {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe answered %d, want %d: %+v", code, want, r)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRelayStoppedAndRunning(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := context.Background()
	table := "health_outbox_" + suffix()
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: table})
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(ctx, db))
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + outbox.DeadLetterTableName(table))
	})
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pub.Close() })
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, Table: table, DisableNotify: true, PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)

	h, err := health.NewHandler(health.Config{DB: db, Relay: relay, MaxBacklogAge: time.Minute})
	require.NoError(t, err)

	// Stopped, with a message waiting.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, ob.WriteTx(ctx, tx, outbox.Outgoing{Topic: "t", Message: message.NewMessage(watermill.NewUUID(), []byte("x"))}))
	require.NoError(t, tx.Commit())

	code, r := get(t, h.Readiness())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, health.StatusFail, r.Status)
	require.Equal(t, health.StatusOK, r.Checks["database"].Status)
	require.Equal(t, health.StatusFail, r.Checks["relay"].Status)
	require.Equal(t, "relay is not running", r.Checks["relay"].Error)
	require.EqualValues(t, 1, r.Checks["relay"].Details["backlog_messages"])
	code, r = get(t, h.Liveness())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, health.StatusFail, r.Checks["relay"].Status)

	// Running: ready at once (the message is younger than MaxBacklogAge),
	// and the relay forwards the backlog.
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })
	r = eventually(t, h.Readiness(), http.StatusOK)
	require.Equal(t, health.StatusOK, r.Checks["relay"].Status)
	require.Equal(t, true, r.Checks["relay"].Details["running"])
	deadline := time.Now().Add(10 * time.Second)
	for r.Checks["relay"].Details["backlog_messages"] != float64(0) {
		require.True(t, time.Now().Before(deadline), "the relay never forwarded the backlog: %+v", r)
		time.Sleep(10 * time.Millisecond)
		code, r = get(t, h.Readiness())
		require.Equal(t, http.StatusOK, code, "%+v", r)
	}
	code, _ = get(t, h.Liveness())
	require.Equal(t, http.StatusOK, code)

	// Stopped again.
	require.NoError(t, relay.Close())
	require.NoError(t, <-done)
	done <- nil
	code, r = get(t, h.Readiness())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "relay is not running", r.Checks["relay"].Error)
}

func TestRelayBacklogTooOld(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := context.Background()
	table := "health_outbox_" + suffix()
	ob, err := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: table})
	require.NoError(t, err)
	require.NoError(t, ob.Migrate(ctx, db))
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + outbox.DeadLetterTableName(table))
	})
	// A publisher that refuses everything keeps the row in the outbox
	// while the relay runs.
	pub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	require.NoError(t, pub.Close()) // a closed GoChannel refuses every Publish
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, Table: table, DisableNotify: true, RetryInterval: 10 * time.Millisecond, MaxAttempts: 1_000_000})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, ob.WriteTx(ctx, tx, outbox.Outgoing{Topic: "t", Message: message.NewMessage(watermill.NewUUID(), []byte("x"))}))
	require.NoError(t, tx.Commit())

	h, err := health.NewHandler(health.Config{Relay: relay, MaxBacklogAge: 50 * time.Millisecond})
	require.NoError(t, err)
	r := eventually(t, h.Readiness(), http.StatusServiceUnavailable)
	require.Contains(t, r.Checks["relay"].Error, "oldest outbox message is")
	require.Equal(t, true, r.Checks["relay"].Details["running"])
	code, _ := get(t, h.Liveness())
	require.Equal(t, http.StatusOK, code, "a backed-up relay that runs is alive")
}

func TestJanitorFailingAndOK(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := context.Background()
	table := "health_inbox_" + suffix()
	repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table) })

	status := health.NewJanitorStatus()
	j, err := janitor.NewJanitor(repo, janitor.Config{Observer: status})
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	h, err := health.NewHandler(health.Config{Janitor: status, MaxJanitorAge: time.Minute})
	require.NoError(t, err)

	code, r := get(t, h.Readiness())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "janitor has made no pass yet", r.Checks["janitor"].Error)

	// The table does not exist yet: the pass fails.
	_, err = j.RunOnce(ctx)
	require.Error(t, err)
	code, r = get(t, h.Readiness())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, r.Checks["janitor"].Error, "janitor's last pass failed")
	code, _ = get(t, h.Liveness())
	require.Equal(t, http.StatusOK, code, "a janitor that still makes passes is alive")

	require.NoError(t, repo.Migrate(ctx))
	_, err = j.RunOnce(ctx)
	require.NoError(t, err)
	code, r = get(t, h.Readiness())
	require.Equal(t, http.StatusOK, code, "%+v", r)
	require.Equal(t, health.StatusOK, r.Checks["janitor"].Status)

	// A pass long ago is too old for both probes.
	late, err := health.NewHandler(health.Config{Janitor: status, MaxJanitorAge: time.Minute,
		Now: func() time.Time { return time.Now().Add(2 * time.Minute) }})
	require.NoError(t, err)
	code, r = get(t, late.Liveness())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, r.Checks["janitor"].Error, "janitor's last pass was")
}

func TestDatabaseDown(t *testing.T) {
	db := testenv.Postgres(t)
	require.NoError(t, db.Close()) // a closed pool fails every ping
	h, err := health.NewHandler(health.Config{DB: db, Timeout: time.Second})
	require.NoError(t, err)
	code, r := get(t, h.Readiness())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, r.Checks["database"].Error, "database does not answer")
	code, _ = get(t, h.Liveness())
	require.Equal(t, http.StatusOK, code, "liveness reads no database")
}

func TestConfigValidate(t *testing.T) {
	_, err := health.NewHandler(health.Config{})
	require.ErrorContains(t, err, "nothing to check")
	_, err = health.NewHandler(health.Config{Janitor: health.NewJanitorStatus(), Timeout: -1})
	require.ErrorContains(t, err, "Timeout must be positive")
}
