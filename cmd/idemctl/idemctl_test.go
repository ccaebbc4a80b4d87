package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// bin is idemctl built once for the tests, run as a real process.
var bin string

func TestMain(m *testing.M) {
	if os.Getenv("IDEMCTL_TEST_CONSUMER") != "" {
		killedConsumer()
		return
	}
	flag.Parse()
	if testing.Short() {
		// Building the binary is most of this package's time; under -short
		// every test that runs it skips (see idemctl).
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "idemctl")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "idemctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// killedConsumer is a two-phase consumer that dies mid-effect: it claims
// the message's key under a short lease and exits before completing, as a
// process killed by the OOM killer would. With IDEMCTL_TEST_CONSUMER=hang
// it blocks in the handler instead, to be killed from outside (the
// session in docs/operations.md); with =redeliver it delivers the message
// again and prints the outcome.
func killedConsumer() {
	mode := os.Getenv("IDEMCTL_TEST_CONSUMER")
	db, err := sql.Open("pgx", os.Getenv("IDEMCTL_TEST_PG"))
	if err != nil {
		panic(err)
	}
	repo, err := postgres.NewRepository(db, postgres.Config{Table: os.Getenv("IDEMCTL_TEST_TABLE")})
	if err != nil {
		panic(err)
	}
	var logger watermill.LoggerAdapter
	if mode != "1" {
		logger = watermill.NewStdLogger(false, false)
	}
	inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: repo, Consumer: "billing", Lease: time.Second, Logger: logger})
	if err != nil {
		panic(err)
	}
	msg := message.NewMessage(os.Getenv("IDEMCTL_TEST_KEY"), []byte(`{"order":"7","amount":42}`))
	_, err = inbox.Middleware(func(*message.Message) ([]*message.Message, error) {
		switch mode {
		case "redeliver":
			fmt.Println("handler ran: the card is charged again")
			return nil, nil
		case "hang":
			fmt.Printf("pid %d: charging the card…\n", os.Getpid())
			select {} // until killed
		}
		fmt.Println("charging the card… and the process dies")
		os.Exit(3)
		return nil, nil
	})(msg)
	if mode == "redeliver" {
		if err != nil {
			fmt.Println("inbox refused the delivery (the router sends it to the poison queue)")
		} else {
			fmt.Println("inbox acknowledged the delivery")
		}
		os.Exit(0)
	}
	os.Exit(1) // not reached: the handler exits
}

type observerFunc func(idempotency.Delivery)

func (f observerFunc) ObserveDelivery(_ context.Context, d idempotency.Delivery) { f(d) }

func suffix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

type result struct {
	stdout, stderr string
	code           int
}

// idemctl runs the binary with env (KEY=VALUE) and stdin.
func idemctl(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	if bin == "" {
		t.Skip("-short: the idemctl binary is not built; run without -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "IDEMCTL_DSN=", "IDEMCTL_REDIS=")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{out.String(), errOut.String(), code}
}

// pgInbox creates a plain PostgreSQL inbox table for t, dropped when t
// ends, and returns the DSN idemctl takes, the database, the repository
// and the table.
func pgInbox(t *testing.T) (string, *sql.DB, *postgres.Repository[*sql.Tx], string) {
	t.Helper()
	dsn := pgDSN(t)
	db := testPostgres(t)
	table := "idemctl_inbox_" + suffix()
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table) })
	repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	return dsn, db, repo, table
}

// insertExpired inserts n completed records of consumer into table that
// expired a day ago, what purge deletes.
func insertExpired(t *testing.T, db *sql.DB, table, consumer string, n int) {
	t.Helper()
	_, err := db.Exec(`INSERT INTO `+table+` (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
		SELECT $1, 'k' || g, 'completed', '\x00', 1, now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
		FROM generate_series(1, $2::int) g`, consumer, n)
	require.NoError(t, err)
}

func pgDSN(t *testing.T) string {
	testPostgres(t) // skips (or fails under CI) without PostgreSQL
	return postgresDSN()
}

// leaveStuck leaves what a killed consumer leaves: billing/key in progress
// under dead-owner's lease, expired 30 s ago, input "p".
func leaveStuck(t *testing.T, repo repository.TwoPhase, key string) {
	t.Helper()
	now := time.Now()
	_, err := repo.Acquire(t.Context(), repository.AcquireParams{Consumer: "billing", Key: key, PayloadHash: repository.HashPayload([]byte("p")),
		Owner: "dead-owner", Now: now.Add(-time.Minute), LeaseUntil: now.Add(-30 * time.Second), ExpiresAt: now.Add(time.Hour)})
	require.NoError(t, err)
}

func TestStuckRecordOfAKilledConsumer(t *testing.T) {
	dsn := pgDSN(t)
	db := testPostgres(t)
	table := "idemctl_inbox_" + suffix()
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table) })
	env := []string{"IDEMCTL_DSN=" + dsn}

	r := idemctl(t, env, "", "--table", table, "migrate", "status")
	require.Equal(t, exitPending, r.code, r.stderr)
	require.Regexp(t, `0001\s+create_inbox\s+pending`, r.stdout)
	r = idemctl(t, env, "", "--table", table, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "applied 0001_create_inbox to "+table)
	require.Contains(t, r.stdout, "inbox table "+table+": up to date")
	r = idemctl(t, env, "", "--table", table, "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "inbox table "+table+": 0 pending")
	require.Regexp(t, `0001\s+create_inbox\s+applied 20`, r.stdout)

	// A two-phase consumer dies mid-effect.
	key := watermill.NewUUID()
	consumer := exec.Command(os.Args[0])
	consumer.Env = append(os.Environ(), "IDEMCTL_TEST_CONSUMER=1", "IDEMCTL_TEST_PG="+dsn, "IDEMCTL_TEST_TABLE="+table, "IDEMCTL_TEST_KEY="+key)
	out, err := consumer.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 3, exit.ExitCode(), "%s", out)

	// Its lease expires: stuck list shows the record.
	var stuck []stuckRecord
	deadline := time.Now().Add(30 * time.Second)
	for len(stuck) == 0 {
		require.True(t, time.Now().Before(deadline), "the record never showed up as stuck")
		r = idemctl(t, env, "", "--table", table, "--json", "stuck", "list", "--consumer", "billing")
		require.Equal(t, 0, r.code, r.stderr)
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &stuck), r.stdout)
		if len(stuck) == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	require.Len(t, stuck, 1)
	require.Equal(t, key, stuck[0].Key)
	require.NotEmpty(t, stuck[0].LeaseOwner)
	r = idemctl(t, env, "", "--table", table, "stuck", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `CONSUMER\s+KEY\s+LEASE_OWNER\s+LEASE\s+ATTEMPTS\s+CREATED`, r.stdout)
	require.Contains(t, r.stdout, key)

	r = idemctl(t, env, "", "--table", table, "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `billing\s+0\s+1\s+0`, r.stdout)

	// Unknown consumer and unknown key: clear errors, exit status 2.
	r = idemctl(t, env, "", "--table", table, "stuck", "list", "--consumer", "biling")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `unknown consumer "biling"`)
	require.Contains(t, r.stderr, "billing")
	r = idemctl(t, env, "", "--table", table, "stuck", "resolve", "--consumer", "billing", "--key", "nope", "--complete", "--yes")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `has no record with key "nope"`)

	// Without a terminal and without --yes, resolve refuses and changes nothing.
	r = idemctl(t, env, "y\n", "--table", table, "stuck", "resolve", "--consumer", "billing", "--key", key, "--complete")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "will mark it completed")
	require.Contains(t, r.stderr, "refusing to complete record billing/"+key+" without confirmation")

	// A wrong (mistyped) expected owner is refused, saying whose it is.
	r = idemctl(t, env, "", "--table", table, "stuck", "resolve", "--consumer", "billing", "--key", key, "--owner", "someone-else", "--complete", "--yes")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `no in-progress record billing/`+key+` is owned by "someone-else": its lease owner is "`+stuck[0].LeaseOwner+`"`)
	require.NotContains(t, r.stderr, "took it over;")

	r = idemctl(t, env, "", "--table", table, "stuck", "resolve", "--consumer", "billing", "--key", key, "--owner", stuck[0].LeaseOwner, "--complete", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "resolved billing/"+key+": complete")
	r = idemctl(t, env, "", "--table", table, "stuck", "list")
	require.Equal(t, "no stuck records\n", r.stdout)

	// The redelivery is a duplicate: acknowledged, the handler not run.
	repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
	require.NoError(t, err)
	var outcomes []idempotency.Outcome
	inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: repo, Consumer: "billing",
		Observer: observerFunc(func(d idempotency.Delivery) { outcomes = append(outcomes, d.Outcome) })})
	require.NoError(t, err)
	ran := false
	_, err = inbox.Middleware(func(*message.Message) ([]*message.Message, error) {
		ran = true
		return nil, nil
	})(message.NewMessage(key, []byte(`{"order":"7","amount":42}`)))
	require.NoError(t, err)
	require.False(t, ran)
	require.Equal(t, []idempotency.Outcome{idempotency.OutcomeDuplicate}, outcomes)
	rec, err := repo.Get(t.Context(), "billing", key)
	require.NoError(t, err)
	require.Equal(t, repository.StateCompleted, rec.State)
}

func TestCompleteWithResultReplaysIt(t *testing.T) {
	dsn, _, repo, table := pgInbox(t)
	leaveStuck(t, repo, "k1")
	file := filepath.Join(t.TempDir(), "result.json")
	require.NoError(t, os.WriteFile(file, []byte(`[{"uuid":"pay-1","metadata":{"k":"v"},"payload":"{\"paid\":42}"},
		{"uuid":"pay-2","payload_base64":"/wBh/g=="}]`), 0o600))
	env := []string{"IDEMCTL_DSN=" + dsn}
	r := idemctl(t, env, "", "--table", table, "stuck", "resolve", "--consumer", "billing", "--key", "k1", "--complete", "--result", file, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "replaying 2 output messages\n")
	rec, err := repo.Get(t.Context(), "billing", "k1")
	require.NoError(t, err)
	msgs, err := middleware.DecodeResult(rec.Result)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.Equal(t, "pay-1", msgs[0].UUID)
	require.Equal(t, "v", msgs[0].Metadata.Get("k"))
	require.Equal(t, `{"paid":42}`, string(msgs[0].Payload))
	require.Equal(t, "pay-2", msgs[1].UUID)
	require.Equal(t, []byte{0xff, 0x00, 'a', 0xfe}, []byte(msgs[1].Payload), "payload_base64 is decoded byte for byte")

	// One message, in a file giving a payload both ways: refused.
	leaveStuck(t, repo, "k2")
	require.NoError(t, os.WriteFile(file, []byte(`[{"uuid":"pay-3","payload":"x","payload_base64":"eA=="}]`), 0o600))
	r = idemctl(t, env, "", "--table", table, "stuck", "resolve", "--consumer", "billing", "--key", "k2", "--complete", "--result", file, "--yes")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "gives both payload and payload_base64")
	leaveStuck(t, repo, "k3")
	require.NoError(t, os.WriteFile(file, []byte(`[{"uuid":"pay-3","payload":"x"}]`), 0o600))
	r = idemctl(t, env, "", "--table", table, "stuck", "resolve", "--consumer", "billing", "--key", "k3", "--complete", "--result", file, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "replaying 1 output message\n")
}

func TestReleaseDeletesTheRecord(t *testing.T) {
	dsn, _, repo, table := pgInbox(t)
	leaveStuck(t, repo, "k1")
	env := []string{"IDEMCTL_DSN=" + dsn}
	r := idemctl(t, env, "", "--table", table, "--json", "stuck", "resolve", "--consumer", "billing", "--key", "k1", "--release", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `{"consumer":"billing","key":"k1","action":"release","lease_owner":"dead-owner"}`, r.stdout)
	_, err := repo.Get(t.Context(), "billing", "k1")
	require.ErrorIs(t, err, repository.ErrNotFound)
}

func TestPurgeWithProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("inserts 30,000 rows")
	}
	dsn, db, _, table := pgInbox(t)
	insertExpired(t, db, table, "billing", 30000)
	_, err := db.Exec(`INSERT INTO ` + table + ` (consumer, dedup_key, state, payload_hash, attempts, created_at, completed_at, expires_at)
		VALUES ('billing', 'live', 'completed', '\x00', 1, now(), now(), now() + interval '1 day')`)
	require.NoError(t, err)
	env := []string{"IDEMCTL_DSN=" + dsn}

	r := idemctl(t, env, "", "--table", table, "purge") // --expired is the default
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "30000 records expired before")
	require.Contains(t, r.stderr, "refusing to delete 30000 expired records")

	r = idemctl(t, env, "", "--table", table, "purge", "--expired", "--yes", "--batch-size", "2000", "--every", "1ns")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `deleted 2000/30000 \(7%\), \d+ rows/s, ETA \d`, r.stderr)
	require.Regexp(t, `deleted 30000/30000 \(100%\), \d+ rows/s, ETA -`, r.stderr)
	require.Contains(t, r.stdout, "deleted 30000 expired records")
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
	require.Equal(t, 1, n, "the live record stays")
}

func TestDeadLetters(t *testing.T) {
	dsn := pgDSN(t)
	db := testPostgres(t)
	table := "idemctl_outbox_" + suffix()
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + outbox.DeadLetterTableName(table))
	})
	env := []string{"IDEMCTL_DSN=" + dsn}
	inbox := "idemctl_inbox_" + suffix()
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + inbox) })
	r := idemctl(t, env, "", "--table", inbox, "--outbox-table", table, "migrate", "up", "--outbox")
	require.Equal(t, 0, r.code, r.stderr)
	_, err := db.Exec(`INSERT INTO ` + outbox.DeadLetterTableName(table) + ` (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at)
		VALUES (7, 'payments', 'u-1', '{"amount":42}', '{"k":"v"}', 10, 'broker said no', now())`)
	if err != nil {
		t.Skipf("dead-letter table layout differs: %v", err)
	}

	id := listAndShowDeadLetter(t, env, table)
	r = idemctl(t, env, "", "--outbox-table", table, "deadletters", "show", "999999")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "no dead letter with id 999999")

	r = idemctl(t, env, "", "--outbox-table", table, "deadletters", "requeue", id)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "dead letter "+id+": topic payments, uuid u-1")
	require.Contains(t, r.stderr, "refusing to requeue 1 dead letter into")
	r = idemctl(t, env, "", "--outbox-table", table, "deadletters", "requeue", id, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "requeued 1 of 1 dead letter\n")

	r = idemctl(t, env, "", "--outbox-table", table, "--table", inbox, "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `outbox `+table+`: 1 message waiting, oldest .* old, 0 dead letters`, r.stdout)
}

// listAndShowDeadLetter checks that deadletters list (table and JSON,
// listArgs added) and show print the one dead letter the tests insert
// (topic payments, uuid u-1, 10 attempts); it returns its id.
func listAndShowDeadLetter(t *testing.T, env []string, table string, listArgs ...string) string {
	t.Helper()
	r := idemctl(t, env, "", append([]string{"--outbox-table", table, "deadletters", "list"}, listArgs...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `ID\s+TOPIC\s+UUID\s+ATTEMPTS\s+DEAD_LETTERED\s+LAST_ERROR`, r.stdout)
	require.Regexp(t, `\d+\s+payments\s+u-1\s+10\s+.*broker said no`, r.stdout)
	var list []deadLetterJSON
	r = idemctl(t, env, "", append([]string{"--outbox-table", table, "--json", "dl", "list"}, listArgs...)...)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &list), r.stdout)
	require.Len(t, list, 1)
	id := fmt.Sprint(list[0].ID)

	r = idemctl(t, env, "", "--outbox-table", table, "--json", "deadletters", "show", id)
	require.Equal(t, 0, r.code, r.stderr)
	var shown deadLetterJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.Equal(t, []byte(`{"amount":42}`), shown.PayloadBase64)
	require.Contains(t, r.stdout, `"payload_base64": "eyJhbW91bnQiOjQyfQ=="`)
	require.JSONEq(t, `{"k":"v"}`, string(shown.Metadata))
	return id
}

func TestErrorsAndHelp(t *testing.T) {
	r := idemctl(t, nil, "", "stats")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "no store given")
	r = idemctl(t, nil, "", "--dsn", "oracle://x", "stats")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--dsn must start with postgres://")
	r = idemctl(t, nil, "", "--dsn", "sqlite:///nonexistent/dir/x.db", "stats")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "run idemctl migrate up")
	r = idemctl(t, nil, "", "frobnicate")
	require.Equal(t, 2, r.code)
	for _, args := range [][]string{{"--help"}, {"stats", "--help"}, {"stuck", "list", "--help"}, {"stuck", "resolve", "--help"},
		{"purge", "--help"}, {"deadletters", "list", "--help"}, {"deadletters", "show", "--help"}, {"deadletters", "requeue", "--help"},
		{"migrate", "up", "--help"}, {"migrate", "status", "--help"}} {
		r = idemctl(t, nil, "", args...)
		require.Equal(t, 0, r.code, "%v", args)
		require.Contains(t, r.stdout, "Usage: idemctl", "%v", args)
	}
}

func TestSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inbox.db")
	env := []string{"IDEMCTL_DSN=sqlite://" + path}
	r := idemctl(t, env, "", "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	db, err := sqlite.Open(path)
	require.NoError(t, err)
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	require.NoError(t, err)
	leaveStuck(t, repo, "k1")
	now := time.Now()
	_, err = repo.Acquire(t.Context(), repository.AcquireParams{Consumer: "billing", Key: "old", PayloadHash: repository.HashPayload([]byte("p")),
		Owner: "o", Now: now.Add(-2 * time.Hour), LeaseUntil: now.Add(-2 * time.Hour).Add(time.Second), ExpiresAt: now.Add(-time.Hour)})
	require.NoError(t, err)
	require.NoError(t, db.Close())

	r = idemctl(t, env, "", "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `billing\s+0\s+1\s+0\s+1\n`, r.stdout)
	r = idemctl(t, []string{"IDEMCTL_DSN=file:" + path}, "", "--json", "stuck", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"lease_owner": "dead-owner"`)
	r = idemctl(t, env, "", "stuck", "resolve", "--consumer", "billing", "--key", "k1", "--complete", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	r = idemctl(t, env, "", "purge", "--expired", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "deleted 1 expired record in")
	r = idemctl(t, env, "", "stats")
	require.Regexp(t, `billing\s+0\s+0\s+1\s+0\n`, r.stdout)
	r = idemctl(t, env, "", "deadletters", "list")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "the outbox lives in PostgreSQL or MySQL")
}

func TestMariaDBStats(t *testing.T) {
	db, dsn := mysqlURL(t)
	table := "idemctl_inbox_" + suffix()
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
	env := []string{"IDEMCTL_DSN=" + dsn}
	r := idemctl(t, env, "", "--table", table, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	r = idemctl(t, env, "", "--table", table, "--outbox-table", "idemctl_none_"+suffix(), "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "no records")
	require.Contains(t, r.stdout, ": no such table")
	r = idemctl(t, env, "", "--table", table, "--json", "migrate", "status")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"pending": 0`)
	require.Contains(t, r.stdout, `"name": "create_inbox"`)
}

func TestRedisStats(t *testing.T) {
	testRedis(t) // skips (or fails under CI) without Redis
	prefix := "idemctl-" + suffix() + ":"
	r := idemctl(t, nil, "", "--redis", "redis://"+redisAddr()+"/0", "--redis-prefix", prefix, "--json", "stats")
	require.Equal(t, 0, r.code, r.stderr)
	require.JSONEq(t, `{"consumers":[]}`, r.stdout)
}
