package middleware_test

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// entityUpdate is the payload of the version-guard tests: the absolute
// state of an entity at a version.
type entityUpdate struct {
	Entity  string `json:"entity"`
	Version int64  `json:"version"`
}

// versioned is an Inbox with a VersionGuard on one database, and a state
// table the handler writes.
type versioned struct {
	d       dialect
	state   string
	inbox   *middleware.Inbox
	guard   *middleware.VersionGuard[*sql.Tx]
	counter *outcomeCounter

	mu          sync.Mutex
	lastApplied map[string]int64
	violations  []string
	applied     map[entityUpdate]int
}

func newVersioned(t *testing.T, d dialect) *versioned {
	t.Helper()
	ctx := t.Context()
	inboxTable, versionsTable := randomName("inbox"), randomName("versions")
	var (
		repo  repository.Driver[*sql.Tx]
		guard repository.VersionGuard[*sql.Tx]
	)
	switch d.name {
	case "postgres":
		r, err := postgres.NewRepository(d.db, postgres.Config{Table: inboxTable})
		require.NoError(t, err)
		require.NoError(t, r.Migrate(ctx))
		s, err := postgres.NewVersionStore(d.db, postgres.VersionConfig{Table: versionsTable})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		repo, guard = r, s
	case "mysql":
		r, err := mysql.NewRepository(d.db, mysql.Config{Table: inboxTable})
		require.NoError(t, err)
		require.NoError(t, r.Migrate(ctx))
		s, err := mysql.NewVersionStore(d.db, mysql.VersionConfig{Table: versionsTable})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		repo, guard = r, s
	default:
		r, err := sqlite.NewRepository(d.db, sqlite.Config{Table: inboxTable})
		require.NoError(t, err)
		require.NoError(t, r.Migrate(ctx))
		s, err := sqlite.NewVersionStore(d.db, sqlite.VersionConfig{Table: versionsTable})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		repo, guard = r, s
	}
	t.Cleanup(func() {
		for _, table := range []string{inboxTable, versionsTable} {
			_, err := d.db.Exec(`DROP TABLE IF EXISTS ` + table)
			require.NoError(t, err)
		}
	})
	v := &versioned{
		d:           d,
		state:       d.table(t, "state", `entity VARCHAR(64) PRIMARY KEY, version BIGINT NOT NULL, body VARCHAR(64) NOT NULL`),
		counter:     &outcomeCounter{},
		lastApplied: map[string]int64{},
		applied:     map[entityUpdate]int{},
	}
	var err error
	v.inbox, err = middleware.NewInbox(repo, middleware.Config{Consumer: "projector", Observer: v.counter})
	require.NoError(t, err)
	v.guard, err = middleware.NewVersionGuard(middleware.VersionGuardConfig[*sql.Tx]{Guard: guard, Consumer: "projector"})
	require.NoError(t, err)
	return v
}

// handle is the projector: it applies the absolute state of the entity at
// the message's version, unless a newer or equal version was applied.
func (v *versioned) handle(msg *message.Message) ([]*message.Message, error) {
	var u entityUpdate
	if err := json.Unmarshal(msg.Payload, &u); err != nil {
		return nil, err
	}
	ctx := msg.Context()
	if err := v.guard.ApplyIfNewer(ctx, u.Entity, u.Version); err != nil {
		return nil, err
	}
	// The entity's version row stays locked until the inbox commits, so
	// deliveries of one entity pass here one at a time.
	v.mu.Lock()
	if prev := v.lastApplied[u.Entity]; prev >= u.Version {
		v.violations = append(v.violations, fmt.Sprintf("%s: applied %d after %d", u.Entity, u.Version, prev))
	}
	v.lastApplied[u.Entity] = u.Version
	v.applied[u]++
	v.mu.Unlock()
	tx, err := idempotency.Tx[*sql.Tx](ctx)
	if err != nil {
		return nil, err
	}
	_, err = tx.ExecContext(ctx, v.d.q(`UPDATE `+v.state+` SET version = ?, body = ? WHERE entity = ?`),
		u.Version, fmt.Sprintf("state at v%d", u.Version), u.Entity)
	return nil, err
}

func (v *versioned) seed(t *testing.T, entities int) {
	for e := range entities {
		_, err := v.d.db.Exec(v.d.q(`INSERT INTO `+v.state+` (entity, version, body) VALUES (?, 0, 'none')`), entityName(e))
		require.NoError(t, err)
	}
}

func (v *versioned) requireFinalState(t *testing.T, entities int, n int64) {
	t.Helper()
	for e := range entities {
		var version int64
		var body string
		require.NoError(t, v.d.db.QueryRow(v.d.q(`SELECT version, body FROM `+v.state+` WHERE entity = ?`), entityName(e)).Scan(&version, &body))
		require.Equal(t, n, version, "%s: the final state is the last version's", entityName(e))
		require.Equal(t, fmt.Sprintf("state at v%d", n), body)
	}
	require.Empty(t, v.violations, "versions must be applied in increasing order")
	for u, count := range v.applied {
		require.Equal(t, 1, count, "%s version %d applied more than once", u.Entity, u.Version)
	}
}

func entityName(e int) string { return fmt.Sprintf("order-%d", e) }

// versionDeliveries returns, for each entity, versions 1..n each as one
// message delivered redeliveries+1 times (same UUID: inbox duplicates) and
// republished once under another UUID (the version guard's duplicates),
// shuffled within windows of the given size.
func versionDeliveries(rng *rand.Rand, entities int, n int64, redeliveries, window int) []*message.Message {
	var out []*message.Message
	for v := int64(1); v <= n; v++ {
		for e := range entities {
			payload, _ := json.Marshal(entityUpdate{Entity: entityName(e), Version: v})
			msg := message.NewMessage(watermill.NewUUID(), payload)
			for range redeliveries + 1 {
				out = append(out, msg.Copy())
			}
			out = append(out, message.NewMessage(watermill.NewUUID(), payload))
		}
	}
	for lo := 0; lo < len(out); lo += window {
		w := out[lo:min(lo+window, len(out))]
		rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
	}
	return out
}

// TestVersionGuardShuffledDeliveries delivers versions 1..N shuffled, with
// redeliveries and republished copies, one at a time, and checks the exact
// outcome of every delivery against a replay of the same sequence.
func TestVersionGuardShuffledDeliveries(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hundreds of routed deliveries per dialect; make test runs it")
	}
	forEachDialect(t, func(t *testing.T, d dialect) {
		const entities, n, redeliveries = 2, 30, 1
		v := newVersioned(t, d)
		v.seed(t, entities)
		h := v.inbox.Middleware(v.handle)
		rng := rand.New(rand.NewPCG(7, 8))
		deliveries := versionDeliveries(rng, entities, n, redeliveries, 12)

		seen := map[string]bool{}
		max := map[string]int64{}
		var wantProcessed, wantStale, wantDuplicate int
		for _, msg := range deliveries {
			var u entityUpdate
			require.NoError(t, json.Unmarshal(msg.Payload, &u))
			switch {
			case seen[msg.UUID]:
				wantDuplicate++
			case u.Version > max[u.Entity]:
				wantProcessed++
				max[u.Entity] = u.Version
			default:
				wantStale++
			}
			seen[msg.UUID] = true
			out, err := h(msg)
			require.NoError(t, err)
			require.Empty(t, out)
		}
		require.Equal(t, wantProcessed, v.counter.get(idempotency.OutcomeProcessed))
		require.Equal(t, wantStale, v.counter.get(idempotency.OutcomeStaleVersion))
		require.Equal(t, wantDuplicate, v.counter.get(idempotency.OutcomeDuplicate))
		require.Zero(t, v.counter.get(idempotency.OutcomeFailed))
		v.requireFinalState(t, entities, n)
		t.Logf("%s: %d deliveries: %d processed, %d stale, %d duplicate", d.name, len(deliveries), wantProcessed, wantStale, wantDuplicate)
	})
}

// TestVersionGuardConcurrentDeliveries delivers the same kind of sequence
// from several goroutines at once.
func TestVersionGuardConcurrentDeliveries(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: hundreds of routed deliveries per dialect; make test runs it")
	}
	forEachDialect(t, func(t *testing.T, d dialect) {
		const entities, n, redeliveries, workers = 3, 30, 2, 8
		v := newVersioned(t, d)
		v.seed(t, entities)
		h := v.inbox.Middleware(v.handle)
		deliveries := versionDeliveries(rand.New(rand.NewPCG(9, 10)), entities, n, redeliveries, 16)
		distinct := map[string]bool{}
		for _, msg := range deliveries {
			distinct[msg.UUID] = true
		}

		work := make(chan *message.Message, len(deliveries))
		for _, msg := range deliveries {
			work <- msg
		}
		close(work)
		var (
			wg       sync.WaitGroup
			retries  atomic.Int64
			mu       sync.Mutex
			failures []error
		)
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for msg := range work {
					for attempt := 0; ; attempt++ {
						_, err := h(msg.Copy())
						if err == nil {
							break
						}
						// The broker would redeliver (MariaDB deadlock victims).
						if attempt < 20 && !errors.Is(err, idempotency.ErrPayloadMismatch) {
							retries.Add(1)
							continue
						}
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
						break
					}
				}
			}()
		}
		wg.Wait()
		require.Empty(t, failures)

		processed := v.counter.get(idempotency.OutcomeProcessed)
		stale := v.counter.get(idempotency.OutcomeStaleVersion)
		duplicate := v.counter.get(idempotency.OutcomeDuplicate)
		require.Equal(t, len(distinct), processed+stale, "each message is processed or skipped as stale exactly once")
		require.Equal(t, len(deliveries)-len(distinct), duplicate, "every other delivery is an inbox duplicate")
		require.Equal(t, len(v.applied), processed, "each processed message applied one version")
		require.EqualValues(t, retries.Load(), v.counter.get(idempotency.OutcomeFailed))
		v.requireFinalState(t, entities, n)
		t.Logf("%s: %d deliveries (%d messages) over %d workers: %d processed, %d stale, %d duplicate, %d retried",
			d.name, len(deliveries), len(distinct), workers, processed, stale, duplicate, retries.Load())
	})
}

func TestVersionGuardOutsideTheInbox(t *testing.T) {
	_, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[*sql.Tx]{})
	require.Error(t, err)

	forEachDialect(t, func(t *testing.T, d dialect) {
		v := newVersioned(t, d)
		err := v.guard.ApplyIfNewer(t.Context(), "order-1", 1)
		require.ErrorIs(t, err, idempotency.ErrNoTransaction)

		// A handler with its own transaction uses ApplyIfNewerTx.
		for _, c := range []struct {
			version int64
			stale   bool
		}{{2, false}, {2, true}, {1, true}, {3, false}} {
			tx, err := d.db.BeginTx(t.Context(), nil)
			require.NoError(t, err)
			err = v.guard.ApplyIfNewerTx(t.Context(), tx, "order-1", c.version)
			require.Equal(t, c.stale, errors.Is(err, middleware.ErrStaleVersion), "version %d: %v", c.version, err)
			if !c.stale {
				require.NoError(t, err)
			}
			require.NoError(t, tx.Commit())
		}
	})
}
