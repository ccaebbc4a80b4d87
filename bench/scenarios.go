package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// inboxRepo is what the transactional scenarios need from a backend.
type inboxRepo interface {
	repository.Driver[*sql.Tx]
	repository.Cleaner
}

// database is one SQL server (or SQLite file) the scenarios write to.
type database struct {
	name string // postgres, sqlite, mysql
	db   *sql.DB
	// quote quotes a table name.
	quote func(table string) string
	// ph is the n-th (1-based) bind placeholder.
	ph func(n int) string
	// newRepo returns a migrated inbox repository on table.
	newRepo func(ctx context.Context, table string) (inboxRepo, error)
	// rt counts the round trips of db's connections; nil in process
	// (SQLite).
	rt *roundTrips
}

// deliver is deliver, recording the round trips d's connections made
// during the run.
func (d *database) deliver(ctx context.Context, h message.HandlerFunc, msgs []*message.Message, c int) (result, error) {
	return countRoundTrips(d.rt, func() (result, error) { return deliver(ctx, h, msgs, c) })
}

// countRoundTrips runs fn and records in its result the round trips rt
// counted meanwhile.
func countRoundTrips(rt *roundTrips, fn func() (result, error)) (result, error) {
	before := rt.load()
	r, err := fn()
	if rt != nil {
		r.roundTrips = rt.load() - before
	}
	return r, err
}

func postgresDB(db *sql.DB, rt *roundTrips) *database {
	return &database{
		rt:    rt,
		name:  "postgres",
		db:    db,
		quote: func(t string) string { return `"` + t + `"` },
		ph:    func(n int) string { return fmt.Sprintf("$%d", n) },
		newRepo: func(ctx context.Context, table string) (inboxRepo, error) {
			r, err := postgres.NewRepository(db, postgres.Config{Table: table})
			if err != nil {
				return nil, err
			}
			return r, r.Migrate(ctx)
		},
	}
}

func sqliteDB(db *sql.DB) *database {
	return &database{
		name:  "sqlite",
		db:    db,
		quote: func(t string) string { return `"` + t + `"` },
		ph:    func(int) string { return "?" },
		newRepo: func(ctx context.Context, table string) (inboxRepo, error) {
			r, err := sqlite.NewRepository(db, sqlite.Config{Table: table})
			if err != nil {
				return nil, err
			}
			return r, r.Migrate(ctx)
		},
	}
}

func mysqlDB(db *sql.DB, rt *roundTrips) *database {
	return &database{
		rt:    rt,
		name:  "mysql",
		db:    db,
		quote: func(t string) string { return "`" + t + "`" },
		ph:    func(int) string { return "?" },
		newRepo: func(ctx context.Context, table string) (inboxRepo, error) {
			r, err := mysql.NewRepository(db, mysql.Config{Table: table})
			if err != nil {
				return nil, err
			}
			return r, r.Migrate(ctx)
		},
	}
}

// tables tracks the tables one run creates and drops them all at the end.
type tables struct {
	d     *database
	names []string
}

func (t *tables) add(name string) string { t.names = append(t.names, name); return name }

func (t *tables) drop() error {
	var errs []error
	for _, n := range t.names {
		if _, err := t.d.db.ExecContext(context.Background(), `DROP TABLE IF EXISTS `+t.d.quote(n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func randomSuffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// business is the handler's table: one INSERT per message is the whole
// business write of every scenario.
type business struct {
	d         *database
	table     string
	insertSQL string
}

func newBusiness(ctx context.Context, d *database, t *tables, prefix string) (*business, error) {
	table := t.add(prefix + "_orders_" + randomSuffix())
	q := d.quote(table)
	if _, err := d.db.ExecContext(ctx, `CREATE TABLE `+q+` (id VARCHAR(64) NOT NULL PRIMARY KEY, amount BIGINT NOT NULL)`); err != nil {
		return nil, fmt.Errorf("create %s: %w", table, err)
	}
	return &business{d: d, table: table, insertSQL: `INSERT INTO ` + q + ` (id, amount) VALUES (` + d.ph(1) + `, ` + d.ph(2) + `)`}, nil
}

func (b *business) insert(ctx context.Context, tx *sql.Tx, msg *message.Message) error {
	_, err := tx.ExecContext(ctx, b.insertSQL, msg.UUID, len(msg.Payload))
	return err
}

func (b *business) count(ctx context.Context) (int, error) {
	var n int
	err := b.d.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+b.d.quote(b.table)).Scan(&n)
	return n, err
}

// bare is scenario A's handler: the INSERT in a transaction of its own.
func (b *business) bare(msg *message.Message) ([]*message.Message, error) {
	ctx := msg.Context()
	tx, err := b.d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	if err := b.insert(ctx, tx, msg); err != nil {
		return nil, errors.Join(err, tx.Rollback())
	}
	return nil, tx.Commit()
}

// inInbox is the handler behind the inbox: the INSERT in the inbox's
// transaction.
func (b *business) inInbox(msg *message.Message) ([]*message.Message, error) {
	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
	if err != nil {
		return nil, err
	}
	return nil, b.insert(msg.Context(), tx, msg)
}

// expect checks that the business table holds exactly n rows: every
// message's effect happened once.
func (b *business) expect(ctx context.Context, n int) error {
	got, err := b.count(ctx)
	if err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("%s holds %d rows, want %d", b.table, got, n)
	}
	return nil
}

// scenarioBare is A: the floor.
func scenarioBare(ctx context.Context, d *database, n, c int) (result, error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_a")
	if err != nil {
		return result{}, err
	}
	r, err := d.deliver(ctx, b.bare, newMessages(n), c)
	if err != nil {
		return result{}, err
	}
	return r, b.expect(ctx, n)
}

// newInbox returns a transactional inbox on a fresh table of t.
func newInbox(ctx context.Context, d *database, t *tables, observer idempotency.Observer, retention time.Duration, mutate ...func(*middleware.Config)) (*middleware.Inbox, inboxRepo, string, error) {
	table := t.add("bench_inbox_" + randomSuffix())
	repo, err := d.newRepo(ctx, table)
	if err != nil {
		return nil, nil, "", err
	}
	config := middleware.Config{
		Consumer: "bench", Observer: observer, Retention: retention, RedeliveryWindow: retention,
	}
	for _, m := range mutate {
		m(&config)
	}
	inbox, err := middleware.NewInbox(repo, config)
	return inbox, repo, table, err
}

// readFirst turns on middleware.Config.ReadFirst.
func readFirst(c *middleware.Config) { c.ReadFirst = true }

// noAdaptiveRead turns off the read the inbox adds by itself while
// duplicates are frequent (middleware.Config.ReadFirstAbove): every
// duplicate is answered in a transaction.
func noAdaptiveRead(c *middleware.Config) { c.ReadFirstAbove = -1 }

// scenarioInbox is B (and E on SQLite and MariaDB).
func scenarioInbox(ctx context.Context, d *database, n, c int, mutate ...func(*middleware.Config)) (result, error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_b")
	if err != nil {
		return result{}, err
	}
	inbox, _, _, err := newInbox(ctx, d, t, nil, 0, mutate...)
	if err != nil {
		return result{}, err
	}
	r, err := d.deliver(ctx, inbox.Middleware(b.inInbox), newMessages(n), c)
	if err != nil {
		return result{}, err
	}
	return r, b.expect(ctx, n)
}

// scenarioDuplicates is C: every message delivered twice. The first pass
// delivers every message once (first deliveries, as in B); the second
// redelivers all of them (every delivery a duplicate). It returns the
// second pass (the duplicate path) and both passes together.
func scenarioDuplicates(ctx context.Context, d *database, n, c int, mutate ...func(*middleware.Config)) (dup, both result, err error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_c")
	if err != nil {
		return result{}, result{}, err
	}
	inbox, _, _, err := newInbox(ctx, d, t, nil, 0, mutate...)
	if err != nil {
		return result{}, result{}, err
	}
	h := inbox.Middleware(b.inInbox)
	msgs := newMessages(n)
	first, err := d.deliver(ctx, h, msgs, c)
	if err != nil {
		return result{}, result{}, err
	}
	dup, err = d.deliver(ctx, h, copies(msgs), c)
	if err != nil {
		return result{}, result{}, err
	}
	both = result{
		n:          first.n + dup.n,
		elapsed:    first.elapsed + dup.elapsed,
		latencies:  append(append([]time.Duration(nil), first.latencies...), dup.latencies...),
		roundTrips: first.roundTrips + dup.roundTrips,
	}
	return dup, both, b.expect(ctx, n)
}

// dedupRepository is Watermill's in-memory deduplication repository. Its
// constructor starts a clean-up goroutine on context.Background() that
// nothing can stop, so the harness makes exactly one, for the process's
// life (as an application would); every run's keys are fresh UUIDs, so
// runs do not see each other's keys.
var dedupRepository wmw.ExpiringKeyRepository

// scenarioDeduplicator is D: Watermill's Deduplicator (keyed by the
// message UUID, in-memory) around the bare handler.
func scenarioDeduplicator(ctx context.Context, d *database, n, c int) (result, error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_d")
	if err != nil {
		return result{}, err
	}
	if dedupRepository == nil {
		if dedupRepository, err = wmw.NewMapExpiringKeyRepository(time.Hour); err != nil {
			return result{}, err
		}
	}
	dedup := &wmw.Deduplicator{
		KeyFactory: func(m *message.Message) (string, error) { return m.UUID, nil },
		Repository: dedupRepository,
	}
	r, err := d.deliver(ctx, dedup.Middleware(b.bare), newMessages(n), c)
	if err != nil {
		return result{}, err
	}
	return r, b.expect(ctx, n)
}

// scenarioRedisTwoPhase is E on Redis: the two-phase inbox (lease in
// Redis) around the bare handler writing to PostgreSQL — the effect is
// outside any transaction the marker could join.
func scenarioRedisTwoPhase(ctx context.Context, d *database, client *goredis.Client, n, c int) (result, error) {
	t := &tables{d: d}
	defer t.drop()
	b, err := newBusiness(ctx, d, t, "bench_e_redis")
	if err != nil {
		return result{}, err
	}
	prefix := "watermill-idempotent-bench:" + randomSuffix() + ":"
	defer deleteRedisPrefix(client, prefix)
	repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: prefix})
	if err != nil {
		return result{}, err
	}
	inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: repo, Consumer: "bench"})
	if err != nil {
		return result{}, err
	}
	r, err := d.deliver(ctx, inbox.Middleware(b.bare), newMessages(n), c)
	if err != nil {
		return result{}, err
	}
	return r, b.expect(ctx, n)
}

func deleteRedisPrefix(client *goredis.Client, prefix string) {
	ctx := context.Background()
	iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			client.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		client.Del(ctx, keys...)
	}
}

// openSQLite opens a fresh SQLite database in a temporary directory; the
// returned function closes it and removes the directory.
func openSQLite() (*sql.DB, func(), error) {
	dir, err := os.MkdirTemp("", "watermill-idempotent-bench")
	if err != nil {
		return nil, nil, err
	}
	db, err := sqlite.Open(filepath.Join(dir, "bench.db"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	return db, func() { _ = db.Close(); _ = os.RemoveAll(dir) }, nil
}
