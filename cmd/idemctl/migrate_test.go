package main

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	redisrepo "github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// mysqlURL is the tests' MariaDB as the URL idemctl takes (mysqlDSN is
// in the driver's format).
func mysqlURL(t *testing.T) (*sql.DB, string) {
	db := testMySQL(t) // skips (or fails under CI) without MariaDB
	dsn := "mysql://root@127.0.0.1:3306/test"
	if v := os.Getenv("IDEMCTL_TEST_MYSQL_URL"); v != "" {
		dsn = v
	}
	return db, dsn
}

type lineStatus struct {
	Table      string          `json:"table"`
	Migrations []migrationJSON `json:"migrations"`
	Pending    int             `json:"pending"`
}

type statusOutput struct {
	Inbox      string          `json:"inbox"`
	Layout     string          `json:"layout"`
	Migrations []migrationJSON `json:"migrations"`
	Pending    int             `json:"pending"`
	Outbox     *lineStatus     `json:"outbox"`
	Versions   *lineStatus     `json:"versions"`
}

// status runs migrate status --json --outbox --versions, which must exit
// with code.
func status(t *testing.T, env []string, code int, args ...string) statusOutput {
	t.Helper()
	r := idemctl(t, env, "", append(append([]string{"--json"}, args...), "migrate", "status", "--outbox", "--versions")...)
	require.Equal(t, code, r.code, r.stderr)
	var out statusOutput
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	require.NotNil(t, out.Outbox, r.stdout)
	require.NotNil(t, out.Versions, r.stdout)
	return out
}

// countFiles counts the up migrations in dir of fsys.
func countFiles(t *testing.T, fsys fs.FS, dir string) int {
	t.Helper()
	ups, err := fs.Glob(fsys, dir+"/*.up.sql")
	require.NoError(t, err)
	require.NotEmpty(t, ups, dir)
	return len(ups)
}

// migrate up --outbox --versions creates the three tables on every SQL
// store, says which numbered migrations it applied to which table, applies
// nothing the second time, and migrate status lists every line's versions
// as applied; before, it lists all of them as pending.
func TestMigrateOutboxAndVersions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dialect sqldialect.Dialect
		open    func(t *testing.T) (db *sql.DB, dsn string)
	}{
		{"postgres", sqldialect.PostgreSQL, func(t *testing.T) (*sql.DB, string) { return testPostgres(t), pgDSN(t) }},
		{"mariadb", sqldialect.MySQL, mysqlURL},
		{"sqlite", sqldialect.SQLite, func(t *testing.T) (*sql.DB, string) {
			return nil, "sqlite://" + filepath.Join(t.TempDir(), "store.db")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, dsn := tc.open(t)
			sfx := suffix()
			inbox, ob, versions := "idemctl_inbox_"+sfx, "idemctl_outbox_"+sfx, "idemctl_versions_"+sfx
			if db != nil {
				t.Cleanup(func() {
					for _, tbl := range []string{inbox, ob, outbox.DeadLetterTableName(ob), versions} {
						_, _ = db.Exec("DROP TABLE IF EXISTS " + tbl)
					}
				})
			}
			env := []string{"IDEMCTL_DSN=" + dsn}
			tables := []string{"--table", inbox, "--outbox-table", ob, "--versions-table", versions}
			outboxFiles := countFiles(t, outbox.Migrations, "migrations/"+string(tc.dialect))

			if db != nil { // SQLite: status needs the file migrate up creates
				before := status(t, env, exitPending, tables...)
				require.Equal(t, len(before.Migrations), before.Pending)
				require.Equal(t, outboxFiles, before.Outbox.Pending)
				require.Equal(t, 1, before.Versions.Pending)
			}

			r := idemctl(t, env, "", append(tables, "migrate", "up", "--outbox", "--versions")...)
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `applied 0001_create_inbox to `+inbox+` in \S+\n`, r.stdout)
			require.Contains(t, r.stdout, "applied 0001_create_outbox to "+ob+"\n")
			require.Regexp(t, `applied 0001_create_versions to `+versions+` in \S+\n`, r.stdout)
			require.Regexp(t, `outbox table `+ob+`: up to date \(migrated in \S+\)\n`, r.stdout)
			require.Contains(t, r.stdout, "versions table "+versions+": up to date\n")
			if outboxFiles > 1 {
				require.Regexp(t, `applied 0002_\w+ to `+ob, r.stdout)
			}

			r = idemctl(t, env, "", append(tables, "migrate", "up", "--outbox", "--versions")...)
			require.Equal(t, 0, r.code, r.stderr)
			require.NotContains(t, r.stdout, "applied")
			require.Contains(t, r.stdout, "inbox table "+inbox+": up to date")
			require.Contains(t, r.stdout, "outbox table "+ob+": up to date\n")

			after := status(t, env, 0, tables...)
			require.Equal(t, 0, after.Pending)
			require.Equal(t, lineStatus{Table: ob, Migrations: after.Outbox.Migrations}, *after.Outbox)
			require.Len(t, after.Outbox.Migrations, outboxFiles)
			require.Equal(t, "create_outbox", after.Outbox.Migrations[0].Name)
			require.Equal(t, 0, after.Versions.Pending)
			require.Equal(t, versions, after.Versions.Table)
			for _, m := range append(after.Outbox.Migrations, after.Versions.Migrations...) {
				require.NotNil(t, m.AppliedAt, "%+v", m)
			}

			r = idemctl(t, env, "", append(tables, "migrate", "status", "--no-inbox", "--outbox")...)
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, "outbox table "+ob+": 0 pending")
			require.NotContains(t, r.stdout, "inbox table")
			require.Regexp(t, `0001\s+create_outbox\s+applied \d{4}-`, r.stdout)
			r = idemctl(t, env, "", append(tables, "migrate", "up", "--no-inbox")...)
			require.Equal(t, 2, r.code)
			require.Contains(t, r.stderr, "nothing to migrate")
		})
	}
}

// The partitioned PostgreSQL inbox under --layout partitioned: migrate
// applies its own line, purge drops whole expired partitions (not rows),
// stuck list and resolve work on it, and a layout that does not match the
// table is refused before anything changes.
func TestPartitionedLayout(t *testing.T) {
	dsn := pgDSN(t)
	db := testPostgres(t)
	table := "idemctl_part_" + suffix()
	plain := "idemctl_inbox_" + suffix()
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS ` + table + `, ` + plain + ` CASCADE`) })
	env := []string{"IDEMCTL_DSN=" + dsn}
	part := []string{"--table", table, "--layout", "partitioned", "--partition-interval", "1h"}

	r := idemctl(t, env, "", append(part, "migrate", "up")...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `applied 0001_create_partitioned_inbox to `+table+` in \S+\n`, r.stdout)
	require.Contains(t, r.stdout, "inbox table "+table+" (partitioned): up to date")
	r = idemctl(t, env, "", append(part, "--json", "migrate", "status")...)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusOutput
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	require.Equal(t, "partitioned", st.Layout)
	require.Equal(t, 0, st.Pending)
	require.Equal(t, "create_partitioned_inbox", st.Migrations[0].Name)

	repo, err := postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: table, Interval: time.Hour})
	require.NoError(t, err)
	now := time.Now()
	hash := repository.HashPayload([]byte("p"))
	for _, key := range []string{"old-1", "old-2"} { // in a partition that ended hours ago
		_, err = repo.Acquire(t.Context(), repository.AcquireParams{Consumer: "billing", Key: key, PayloadHash: hash, Owner: "o",
			Now: now.Add(-5 * time.Hour), LeaseUntil: now.Add(-5 * time.Hour).Add(time.Second), ExpiresAt: now.Add(-3 * time.Hour)})
		require.NoError(t, err)
	}
	leaveStuck(t, repo, "k1")

	// The plain layout on this table, or the partitioned one on a plain
	// table, changes nothing.
	r = idemctl(t, env, "", "--table", table, "purge", "--expired", "--yes")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "is partitioned (postgres.NewPartitionedRepository): pass --layout partitioned")
	r = idemctl(t, env, "", "--table", plain, "migrate", "up")
	require.Equal(t, 0, r.code, r.stderr)
	r = idemctl(t, env, "", "--table", plain, "--layout", "partitioned", "migrate", "up")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "is not partitioned")
	r = idemctl(t, env, "", "--table", plain, "--partition-interval", "1h", "stats")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "go with --layout partitioned")
	r = idemctl(t, []string{"IDEMCTL_DSN=sqlite://" + filepath.Join(t.TempDir(), "x.db")}, "", "--layout", "partitioned", "migrate", "up")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--layout partitioned is PostgreSQL's")

	r = idemctl(t, env, "", append(part, "--json", "stuck", "list")...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"lease_owner": "dead-owner"`)

	r = idemctl(t, env, "", append(part, "purge", "--expired")...)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "2 records expired before")
	require.Contains(t, r.stderr, "refusing to drop the expired partitions of "+table)
	partitions := func() (n int) {
		require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM pg_inherits WHERE inhparent = to_regclass($1)`, table).Scan(&n))
		return n
	}
	before := partitions()
	r = idemctl(t, env, "", append(part, "purge", "--expired", "--yes")...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "partitioned layout: drops the partitions that ended before")
	require.Contains(t, r.stdout, "deleted 2 expired records")
	require.Less(t, partitions(), before, "whole partitions are dropped")
	var n int
	require.NoError(t, db.QueryRow(`SELECT COUNT(*) FROM `+table).Scan(&n))
	require.Equal(t, 1, n, "the live record stays")

	r = idemctl(t, env, "", append(part, "stuck", "resolve", "--consumer", "billing", "--key", "k1", "--release", "--yes")...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "resolved billing/k1: release")
	_, err = repo.Get(t.Context(), "billing", "k1")
	require.ErrorIs(t, err, repository.ErrNotFound)
}

// stuck list and resolve on the Redis inbox: the record a dead attempt
// left is listed, refused while its owner does not match, and completed;
// a long key, stored hashed, is resolved by the form list prints and by
// the original key (both failed before: Get hashed the printed form
// again, Resolve refused the original).
func TestRedisResolve(t *testing.T) {
	client := testRedis(t) // skips (or fails under CI) without Redis
	prefix := redisPrefix(t, client)
	repo, err := redisrepo.NewRepository(client, redisrepo.Config{KeyPrefix: prefix})
	require.NoError(t, err)
	long, long2 := strings.Repeat("order-", 100), strings.Repeat("invoice-", 100)
	for _, key := range []string{"k1", long, long2} {
		leaveStuck(t, repo, key)
	}
	args := []string{"--redis", "redis://" + redisAddr() + "/0", "--redis-prefix", prefix}

	r := idemctl(t, nil, "", append(args, "--json", "stuck", "list")...)
	require.Equal(t, 0, r.code, r.stderr)
	var stuck []stuckRecord
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &stuck), r.stdout)
	require.Len(t, stuck, 3)
	r = idemctl(t, nil, "", append(args, "stuck", "resolve", "--consumer", "billing", "--key", "k1", "--owner", "someone-else", "--release", "--yes")...)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `no in-progress record billing/k1 is owned by "someone-else": its lease owner is "dead-owner"`)
	r = idemctl(t, nil, "", append(args, "stuck", "resolve", "--consumer", "billing", "--key", "k1", "--complete", "--yes")...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "resolved billing/k1: complete")
	rec, err := repo.Get(t.Context(), "billing", "k1")
	require.NoError(t, err)
	require.Equal(t, repository.StateCompleted, rec.State)

	r = idemctl(t, nil, "", append(args, "stuck", "resolve", "--consumer", "billing", "--key", repository.StorageKey(long), "--release", "--yes")...)
	require.Equal(t, 0, r.code, r.stderr)
	_, err = repo.Get(t.Context(), "billing", long)
	require.ErrorIs(t, err, repository.ErrNotFound)
	// The original long key works too.
	r = idemctl(t, nil, "", append(args, "stuck", "resolve", "--consumer", "billing", "--key", long2, "--release", "--yes")...)
	require.Equal(t, 0, r.code, r.stderr)
	_, err = repo.Get(t.Context(), "billing", long2)
	require.ErrorIs(t, err, repository.ErrNotFound)
}

// deadletters list, show and requeue on MariaDB.
func TestMariaDBDeadLetters(t *testing.T) {
	db, dsn := mysqlURL(t)
	table := "idemctl_outbox_" + suffix()
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + table + ", " + outbox.DeadLetterTableName(table))
	})
	env := []string{"IDEMCTL_DSN=" + dsn}
	r := idemctl(t, env, "", "--outbox-table", table, "migrate", "up", "--no-inbox", "--outbox")
	require.Equal(t, 0, r.code, r.stderr)
	_, err := db.Exec("INSERT INTO " + outbox.DeadLetterTableName(table) + ` (outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at)
		VALUES (7, 'payments', 'u-1', '{"amount":42}', '{"k":"v"}', 10, 'broker said no', NOW(6))`)
	require.NoError(t, err)

	id := listAndShowDeadLetter(t, env, table, "--topic", "payments")

	r = idemctl(t, env, "", "--outbox-table", table, "deadletters", "requeue", id, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "requeued 1 of 1 dead letter\n")
	var waiting, dead int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+table+" WHERE topic = 'payments'").Scan(&waiting))
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+outbox.DeadLetterTableName(table)).Scan(&dead))
	require.Equal(t, []int{1, 0}, []int{waiting, dead})
}

// deadletters show --json carries a binary payload byte for byte, base64
// in payload_base64; the table marks it as base64. On PostgreSQL (BYTEA)
// and MariaDB (LONGBLOB).
func TestBinaryDeadLetterPayload(t *testing.T) {
	payload := []byte{0xff, 0x00, 'a', 0xfe, '\n'}
	for _, tc := range []struct {
		name   string
		open   func(t *testing.T) (*sql.DB, string)
		insert string
	}{
		{"postgres", func(t *testing.T) (*sql.DB, string) { return testPostgres(t), pgDSN(t) },
			`(outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at) VALUES (7, 'payments', 'u-1', $1, '{"k":"v"}', 1, 'broker said no', now())`},
		{"mariadb", mysqlURL,
			`(outbox_id, topic, uuid, payload, metadata, attempts, last_error, created_at) VALUES (7, 'payments', 'u-1', ?, '{"k":"v"}', 1, 'broker said no', NOW(6))`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, dsn := tc.open(t)
			table := "idemctl_outbox_" + suffix()
			t.Cleanup(func() {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + table + ", " + outbox.DeadLetterTableName(table))
			})
			env := []string{"IDEMCTL_DSN=" + dsn}
			r := idemctl(t, env, "", "--outbox-table", table, "migrate", "up", "--no-inbox", "--outbox")
			require.Equal(t, 0, r.code, r.stderr)
			_, err := db.Exec("INSERT INTO "+outbox.DeadLetterTableName(table)+" "+tc.insert, payload)
			require.NoError(t, err)

			var list []deadLetterJSON
			r = idemctl(t, env, "", "--outbox-table", table, "--json", "dl", "list")
			require.Equal(t, 0, r.code, r.stderr)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &list), r.stdout)
			require.Len(t, list, 1)
			require.Nil(t, list[0].PayloadBase64, "list prints no payload")
			id := strconv.FormatInt(list[0].ID, 10)

			r = idemctl(t, env, "", "--outbox-table", table, "--json", "dl", "show", id)
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, `"payload_base64": "/wBh/go="`)
			var raw map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))
			require.NotContains(t, raw, "payload", "the payload is only under payload_base64")
			var shown deadLetterJSON
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
			require.Equal(t, payload, shown.PayloadBase64, "0xff and 0x00 survive --json")
			require.JSONEq(t, `{"k":"v"}`, string(shown.Metadata))

			r = idemctl(t, env, "", "--outbox-table", table, "dl", "show", id)
			require.Equal(t, 0, r.code, r.stderr)
			require.Regexp(t, `payload\s+\(5 bytes, base64\) /wBh/go=\n`, r.stdout)

			// An empty payload is "", not left out.
			_, err = db.Exec("INSERT INTO "+outbox.DeadLetterTableName(table)+" "+tc.insert, []byte{})
			require.NoError(t, err)
			r = idemctl(t, env, "", "--outbox-table", table, "--json", "dl", "list", "--after", id)
			require.Equal(t, 0, r.code, r.stderr)
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &list), r.stdout)
			require.Len(t, list, 1)
			r = idemctl(t, env, "", "--outbox-table", table, "--json", "dl", "show", strconv.FormatInt(list[0].ID, 10))
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, `"payload_base64": ""`)
		})
	}
}

// migrate status is a deploy gate: exit status 3 while any migration of a
// table it lists is pending, with the list (or the JSON) printed all the
// same and one line on stderr saying what is pending; 0 once migrate up
// has run.
func TestMigrateStatusExitsThreeWhilePending(t *testing.T) {
	db, dsn := testPostgres(t), pgDSN(t)
	sfx := suffix()
	inbox, ob := "idemctl_inbox_"+sfx, "idemctl_outbox_"+sfx
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + inbox + ", " + ob + ", " + outbox.DeadLetterTableName(ob))
	})
	env := []string{"IDEMCTL_DSN=" + dsn}
	tables := []string{"--table", inbox, "--outbox-table", ob}
	files := countFiles(t, postgres.Migrations, "migrations/inbox")

	r := idemctl(t, env, "", append(tables, "migrate", "status")...)
	require.Equal(t, 3, r.code, r.stderr)
	require.Regexp(t, `0001\s+create_inbox\s+pending`, r.stdout)
	require.Equal(t, fmt.Sprintf("idemctl: not up to date: %s pending on inbox table %s; run idemctl migrate up with the same flags\n", count(files, "migration"), inbox), r.stderr)

	r = idemctl(t, env, "", append(tables, "--json", "migrate", "status")...)
	require.Equal(t, 3, r.code, r.stderr)
	var st statusOutput
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	require.Equal(t, files, st.Pending)

	r = idemctl(t, env, "", append(tables, "migrate", "up")...)
	require.Equal(t, 0, r.code, r.stderr)
	r = idemctl(t, env, "", append(tables, "migrate", "status")...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr)

	// The inbox is up to date, the outbox is not: still pending.
	r = idemctl(t, env, "", append(tables, "migrate", "status", "--outbox")...)
	require.Equal(t, 3, r.code, r.stderr)
	require.Regexp(t, `idemctl: not up to date: \d+ migrations? pending on outbox table `+ob+`; run`, r.stderr)
	require.NotContains(t, r.stderr, "inbox table")
	r = idemctl(t, env, "", append(tables, "migrate", "up", "--outbox")...)
	require.Equal(t, 0, r.code, r.stderr)
	r = idemctl(t, env, "", append(tables, "--json", "migrate", "status", "--outbox")...)
	require.Equal(t, 0, r.code, r.stderr)
}
