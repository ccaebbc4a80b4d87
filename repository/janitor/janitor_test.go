package janitor_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// inbox is a migrated SQLite inbox in t's temporary directory.
type inbox struct {
	db   *sql.DB
	repo *sqlite.Repository
}

func newInbox(t *testing.T) inbox {
	t.Helper()
	db := testenv.SQLite(t)
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	return inbox{db: db, repo: repo}
}

// seed claims consumer's keys prefix-0 … prefix-(n-1), expiring at expiresAt.
func (in inbox) seed(t *testing.T, consumer, prefix string, n int, expiresAt time.Time) {
	t.Helper()
	ctx := t.Context()
	tx, err := in.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		c, err := claimTx(ctx, in.repo, tx, repository.ClaimParams{
			Consumer: consumer, Key: key, PayloadHash: repository.HashPayload([]byte(key)),
			Now: expiresAt.Add(-time.Hour), ExpiresAt: expiresAt,
		})
		require.NoError(t, err)
		require.True(t, c.Claimed)
	}
	require.NoError(t, tx.Commit())
}

func (in inbox) count(t *testing.T, consumer string) int {
	t.Helper()
	var n int
	require.NoError(t, in.db.QueryRowContext(t.Context(),
		`SELECT COUNT(*) FROM watermill_inbox WHERE consumer = ?`, consumer).Scan(&n))
	return n
}

// clock is a settable Config.Now.
type clock struct{ now atomic.Pointer[time.Time] }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.set(t)
	return c
}

func (c *clock) set(t time.Time)     { c.now.Store(&t) }
func (c *clock) Now() time.Time      { return *c.now.Load() }
func (c *clock) add(d time.Duration) { c.set(c.Now().Add(d)) }

// batches records every Batch and signals each one.
type batches struct {
	mu   sync.Mutex
	all  []janitor.Batch
	each chan janitor.Batch
}

func newBatches() *batches { return &batches{each: make(chan janitor.Batch, 1024)} }

// ObserveJanitorBatch makes batches a janitor.Observer.
func (b *batches) ObserveJanitorBatch(_ context.Context, batch janitor.Batch) { b.record(batch) }

func (b *batches) record(batch janitor.Batch) {
	b.mu.Lock()
	b.all = append(b.all, batch)
	b.mu.Unlock()
	select {
	case b.each <- batch:
	default:
	}
}

// next waits for the next batch, failing t after a deadline.
func (b *batches) next(t *testing.T) janitor.Batch {
	t.Helper()
	select {
	case batch := <-b.each:
		return batch
	case <-time.After(10 * time.Second):
		t.Fatal("no janitor batch within 10s")
		return janitor.Batch{}
	}
}

func (b *batches) deleted() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n []int
	for _, batch := range b.all {
		n = append(n, batch.Deleted)
	}
	return n
}

func TestNewJanitorValidatesConfig(t *testing.T) {
	in := newInbox(t)

	_, err := janitor.NewJanitor(in.repo, janitor.Config{})
	require.NoError(t, err, "the zero Config takes defaults")

	_, err = janitor.NewJanitor(nil, janitor.Config{})
	require.ErrorContains(t, err, "cleaner is nil")

	for name, c := range map[string]janitor.Config{
		"negative interval":   {Interval: -time.Second},
		"negative batch size": {BatchSize: -1},
		"negative pause":      {Pause: -time.Millisecond},
	} {
		_, err := janitor.NewJanitor(in.repo, c)
		require.ErrorContains(t, err, "invalid config", name)
	}

	require.Error(t, janitor.Config{}.Validate(), "Validate rejects the zero value: defaults come from NewJanitor")
}

func TestRunOnceDrainsExpiredInBatches(t *testing.T) {
	in := newInbox(t)
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	in.seed(t, "billing", "expired", 25, now.Add(-time.Minute))
	in.seed(t, "billing", "live", 5, now.Add(time.Minute))

	b := newBatches()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{
		BatchSize: 10,
		Pause:     time.Millisecond,
		Now:       func() time.Time { return now },
		Observer:  b,
	})
	require.NoError(t, err)
	defer j.Close()

	n, err := j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 25, n)
	require.Equal(t, []int{10, 10, 5}, b.deleted(), "bounded batches, stopping at the first short one")
	require.Equal(t, 5, in.count(t, "billing"), "live records are untouched")

	n, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to delete")
}

func TestRunDeletesPeriodicallyUntilClosed(t *testing.T) {
	in := newInbox(t)
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clk := newClock(start)
	in.seed(t, "billing", "k", 3, start.Add(time.Hour))

	b := newBatches()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{
		Interval: 5 * time.Millisecond,
		Now:      clk.Now,
		Observer: b,
	})
	require.NoError(t, err)

	runErr := make(chan error, 1)
	go func() { runErr <- j.Run(context.Background()) }()

	require.Zero(t, b.next(t).Deleted, "the first pass runs at once and finds nothing expired")
	require.Equal(t, 3, in.count(t, "billing"))

	clk.add(2 * time.Hour)
	for {
		if b.next(t).Deleted == 3 {
			break
		}
	}
	require.Zero(t, in.count(t, "billing"), "a later pass removed the records once they expired")

	require.ErrorIs(t, j.Run(t.Context()), janitor.ErrRunning)
	require.NoError(t, j.Close())
	require.NoError(t, <-runErr, "Run returns nil when closed")
	require.NoError(t, j.Close(), "Close is idempotent")

	require.ErrorIs(t, j.Run(t.Context()), janitor.ErrClosed)
	_, err = j.RunOnce(t.Context())
	require.ErrorIs(t, err, janitor.ErrClosed)
}

func TestRunStopsWithContext(t *testing.T) {
	in := newInbox(t)
	j, err := janitor.NewJanitor(in.repo, janitor.Config{})
	require.NoError(t, err)
	defer j.Close()

	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- j.Run(ctx) }()
	cancel()
	require.NoError(t, <-runErr)
}

func TestRunLogsFailedPassesAndKeepsGoing(t *testing.T) {
	in := newInbox(t)
	now := time.Now()
	logger := watermill.NewCaptureLogger()
	b := newBatches()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{
		Interval: 5 * time.Millisecond,
		Observer: b,
		Logger:   logger,
	})
	require.NoError(t, err)

	// A missing table makes every pass fail until it is back.
	_, err = in.db.ExecContext(t.Context(), `DROP TABLE watermill_inbox`)
	require.NoError(t, err)

	runErr := make(chan error, 1)
	go func() { runErr <- j.Run(context.Background()) }()
	for range 2 {
		require.Error(t, b.next(t).Err, "passes fail while the table is missing")
	}

	require.NoError(t, in.repo.Migrate(t.Context()))
	in.seed(t, "billing", "expired", 4, now.Add(-time.Minute))
	for {
		if batch := b.next(t); batch.Err == nil && batch.Deleted == 4 {
			break
		}
	}
	require.NoError(t, j.Close())
	require.NoError(t, <-runErr)

	// The janitor has stopped, so the captured logs no longer change.
	logs := logger.Captured()
	require.NotEmpty(t, logs[watermill.ErrorLogLevel], "failed passes are logged at Error")
	require.Equal(t, "Inbox janitor pass failed", logs[watermill.ErrorLogLevel][0].Msg)
	var removed bool
	for _, m := range logs[watermill.InfoLogLevel] {
		if m.Msg == "Inbox janitor removed expired records" {
			removed = true
			require.Equal(t, 4, m.Fields["deleted"])
			require.Contains(t, m.Fields, "duration")
		}
	}
	require.True(t, removed, "a successful pass logs what it removed at Info")
}

func TestCloseInterruptsPass(t *testing.T) {
	in := newInbox(t)
	in.seed(t, "billing", "expired", 3, time.Now().Add(-time.Minute))

	b := newBatches()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{
		BatchSize: 1,
		Pause:     time.Hour, // a pass would take hours without Close
		Observer:  b,
	})
	require.NoError(t, err)

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := j.RunOnce(context.Background())
		done <- result{n, err}
	}()
	require.Equal(t, 1, b.next(t).Deleted)
	require.NoError(t, j.Close(), "Close returns once the pass has stopped")

	r := <-done
	require.ErrorIs(t, r.err, context.Canceled)
	require.Equal(t, 1, r.n, "RunOnce reports what it deleted before it stopped")
	require.Equal(t, 2, in.count(t, "billing"))
}

func TestRouterPluginFollowsRouterLifecycle(t *testing.T) {
	in := newInbox(t)
	in.seed(t, "billing", "expired", 3, time.Now().Add(-time.Minute))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	b := newBatches()
	j, err := janitor.NewJanitor(in.repo, janitor.Config{Observer: b})
	require.NoError(t, err)
	defer j.Close()

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	router.AddPlugin(j.RouterPlugin())

	routerErr := make(chan error, 1)
	go func() { routerErr <- router.Run(context.Background()) }()
	<-router.Running()

	require.Equal(t, 3, b.next(t).Deleted, "the janitor runs a pass as soon as the router runs")
	require.ErrorIs(t, j.Run(t.Context()), janitor.ErrRunning, "the plugin's Run is in progress")

	require.NoError(t, router.Close())
	require.NoError(t, <-routerErr)

	// Without calling Close: the janitor notices the closed router and
	// stops, after which it can run again.
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		return j.Run(ctx) == nil
	}, 5*time.Second, 10*time.Millisecond, "the janitor stops when its router closes")
}

func TestRouterPluginRefusesClosedJanitor(t *testing.T) {
	in := newInbox(t)
	j, err := janitor.NewJanitor(in.repo, janitor.Config{})
	require.NoError(t, err)
	require.NoError(t, j.Close())

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	require.NoError(t, err)
	router.AddPlugin(j.RouterPlugin())
	require.ErrorIs(t, router.Run(t.Context()), janitor.ErrClosed)
}

// claimTx claims p alone in tx through d, as the inbox does for one
// delivery.
func claimTx(ctx context.Context, d repository.Driver[*sql.Tx], tx *sql.Tx, p repository.ClaimParams) (repository.Claim, error) {
	claims, err := d.Claim(ctx, tx, []repository.ClaimParams{p})
	if err != nil {
		return repository.Claim{}, err
	}
	return claims[0], nil
}
