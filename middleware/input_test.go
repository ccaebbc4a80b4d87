package middleware_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// unstorable are keys and entities no backend can hold as they are: a NUL
// byte (PostgreSQL text refuses it), invalid UTF-8 (PostgreSQL and
// MySQL's utf8mb4 refuse it) and more bytes than the columns hold.
var unstorable = []struct{ name, value string }{
	{"nul", "order\x00-1"},
	{"invalid-utf8", "order-\xff\xfe-1"},
	{"300-bytes", strings.Repeat("k", 300)},
}

// attempts is the outermost middleware of the input tests: it counts every
// delivery the router hands to the handler chain and every error it gets
// back, which the router would nack (a loop when it never stops).
type attempts struct {
	total, failed, acked atomic.Int64

	mu      sync.Mutex
	lastErr map[string]string // by message UUID
}

func (a *attempts) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		a.total.Add(1)
		out, err := h(msg)
		if err != nil {
			a.failed.Add(1)
			a.mu.Lock()
			if a.lastErr == nil {
				a.lastErr = map[string]string{}
			}
			a.lastErr[msg.UUID] = err.Error()
			a.mu.Unlock()
		} else {
			a.acked.Add(1)
		}
		return out, err
	}
}

// waitAcked waits until n deliveries were acknowledged and fails naming
// the counters when they were not within the deadline.
func (a *attempts) waitAcked(t *testing.T, f *flow, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.acked.Load() < n {
		if time.Now().After(deadline) {
			a.mu.Lock()
			defer a.mu.Unlock()
			t.Fatalf("after 10 s: %d deliveries, %d failed (nacked and redelivered), %d acknowledged of %d expected, %d poisoned; last errors: %q",
				a.total.Load(), a.failed.Load(), a.acked.Load(), n, len(f.downstreamOf(poisonTopic)), a.lastErr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// versionGuardFor creates a versions table beside s's inbox and returns
// how a handler applies a version in its inbox transaction (the
// middleware's VersionGuard for consumer, on the pgx.Tx on the pgx
// store) and how a test reads the last one applied.
func versionGuardFor(t *testing.T, s *store, consumer string) (apply func(ctx context.Context, entity string, version int64) error, lastVersion func(scope, entity string) (int64, error)) {
	t.Helper()
	table := randomName("versions")
	t.Cleanup(func() {
		_, err := s.db.Exec(`DROP TABLE IF EXISTS ` + table)
		require.NoError(t, err)
	})
	ctx := t.Context()
	guard := func(v repository.VersionGuard[*sql.Tx]) func(context.Context, string, int64) error {
		g, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[*sql.Tx]{Guard: v, Consumer: consumer})
		require.NoError(t, err)
		return g.ApplyIfNewer
	}
	switch {
	case s.pool != nil:
		v, err := postgres.NewPgxVersionStore(s.pool, postgres.VersionConfig{Table: table})
		require.NoError(t, err)
		require.NoError(t, v.Migrate(ctx))
		g, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[pgx.Tx]{Guard: v, Consumer: consumer})
		require.NoError(t, err)
		return g.ApplyIfNewer, func(c, e string) (int64, error) { return v.LastVersion(ctx, c, e) }
	case s.name == "postgres":
		v, err := postgres.NewVersionStore(s.db, postgres.VersionConfig{Table: table})
		require.NoError(t, err)
		require.NoError(t, v.Migrate(ctx))
		return guard(v), func(c, e string) (int64, error) { return v.LastVersion(ctx, c, e) }
	case s.name == "mysql":
		v, err := mysql.NewVersionStore(s.db, mysql.VersionConfig{Table: table})
		require.NoError(t, err)
		require.NoError(t, v.Migrate(ctx))
		return guard(v), func(c, e string) (int64, error) { return v.LastVersion(ctx, c, e) }
	default:
		v, err := sqlite.NewVersionStore(s.db, sqlite.VersionConfig{Table: table})
		require.NoError(t, err)
		require.NoError(t, v.Migrate(ctx))
		return guard(v), func(c, e string) (int64, error) { return v.LastVersion(ctx, c, e) }
	}
}

// TestRouterUnstorableInputIsStoredSafely sends keys and version-guard
// entities with a NUL byte, invalid UTF-8 and 300 bytes through a router
// wired as the README does (poison queue filtered by IsPermanent), on
// PostgreSQL in every pgx query exec mode on both drivers. Each message
// runs its handler once; its redelivery is a duplicate; a second message
// for the same entity and version is stale; nothing fails, loops or is
// poisoned.
func TestRouterUnstorableInputIsStoredSafely(t *testing.T) {
	run := func(t *testing.T, s *store) {
		f := newFlow(t)
		applyIfNewer, lastVersion := versionGuardFor(t, s, "billing")
		poison, err := wmiddleware.PoisonQueueWithFilter(f.pubSub, poisonTopic, idempotency.IsPermanent)
		require.NoError(t, err)
		var a attempts
		f.router.AddMiddleware(a.middleware, poison, s.newInbox(t, "billing", func(c *middleware.Config) {
			c.Key = middleware.MetadataKey("idempotency_key")
		}).Middleware)

		var mu sync.Mutex
		runs, applied := map[string]int{}, map[string]int{}
		f.router.AddConsumerHandler("billing", ordersTopic, f.pubSub, func(msg *message.Message) error {
			entity := msg.Metadata.Get("entity")
			version, err := strconv.ParseInt(msg.Metadata.Get("version"), 10, 64)
			if err != nil {
				return err
			}
			mu.Lock()
			runs[msg.UUID]++
			mu.Unlock()
			if err := applyIfNewer(msg.Context(), entity, version); err != nil {
				return err
			}
			if err := s.execInTx(msg.Context(), `INSERT INTO `+s.charges+` (order_id, amount) VALUES (?, 1)`, msg.UUID); err != nil {
				return err
			}
			mu.Lock()
			applied[entity]++
			mu.Unlock()
			return nil
		})
		f.collect(t, poisonTopic)
		f.run(t)

		msg := func(uuid, key, entity string) *message.Message {
			m := message.NewMessage(uuid, []byte(uuid))
			m.Metadata.Set("idempotency_key", key)
			m.Metadata.Set("entity", entity)
			m.Metadata.Set("version", "1")
			return m
		}
		for _, c := range unstorable {
			f.publish(t, msg("first-"+c.name, c.value, c.value))
		}
		a.waitAcked(t, f, int64(len(unstorable)))
		for _, c := range unstorable {
			f.publish(t,
				msg("first-"+c.name, c.value, c.value),         // a redelivery: the inbox's duplicate
				msg("stale-"+c.name, "other-"+c.name, c.value), // same entity and version: stale
			)
		}
		a.waitAcked(t, f, int64(3*len(unstorable)))

		require.Zero(t, a.failed.Load(), "no delivery may fail (and be redelivered)")
		require.EqualValues(t, 3*len(unstorable), a.total.Load())
		require.Empty(t, f.downstreamOf(poisonTopic))
		for _, c := range unstorable {
			require.Equal(t, 1, runs["first-"+c.name], "%s: the handler runs once; the redelivery is a duplicate", c.name)
			require.Equal(t, 1, runs["stale-"+c.name], "%s: the other key runs the handler", c.name)
			require.Equal(t, 1, applied[c.value], "%s: the entity's version applies once", c.name)
			require.Equal(t, 1, s.chargesFor(t, "first-"+c.name), c.name)
			require.Zero(t, s.chargesFor(t, "stale-"+c.name), c.name)
			// The inbox "billing" on the handler "billing" scopes by both.
			rec, err := s.repo.Get(t.Context(), "billing/billing", c.value)
			require.NoError(t, err, c.name)
			require.Equal(t, repository.StorageKey(c.value), rec.Key, c.name)
			v, err := lastVersion("billing/billing", c.value)
			require.NoError(t, err, c.name)
			require.EqualValues(t, 1, v, c.name)
		}
	}
	forEachStore(t, run, "sqlite", "mysql")
	forEachPostgresMode(t, run)
}

// TestRouterUnstorableKeyTwoPhase is the same for the two-phase inbox on
// every backend, including memory and Redis, and on PostgreSQL in every
// pgx query exec mode on both drivers.
func TestRouterUnstorableKeyTwoPhase(t *testing.T) {
	run := func(t *testing.T, repo leaseRepo) {
		f := newFlow(t)
		poison, err := wmiddleware.PoisonQueueWithFilter(f.pubSub, poisonTopic, idempotency.IsPermanent)
		require.NoError(t, err)
		var a attempts
		f.router.AddMiddleware(a.middleware, poison, newTwoPhase(t, repo, func(c *middleware.TwoPhaseConfig) {
			c.Key = middleware.MetadataKey("idempotency_key")
		}).Middleware)
		var api paymentAPI
		f.router.AddConsumerHandler("payments", ordersTopic, f.pubSub, func(msg *message.Message) error {
			api.charge(msg.Metadata.Get("idempotency_key"))
			return nil
		})
		f.collect(t, poisonTopic)
		f.run(t)

		msg := func(c struct{ name, value string }) *message.Message {
			m := message.NewMessage("m-"+c.name, []byte(c.name))
			m.Metadata.Set("idempotency_key", c.value)
			return m
		}
		for _, c := range unstorable {
			f.publish(t, msg(c))
		}
		a.waitAcked(t, f, int64(len(unstorable)))
		for _, c := range unstorable {
			f.publish(t, msg(c))
		}
		a.waitAcked(t, f, int64(2*len(unstorable)))

		require.Zero(t, a.failed.Load(), "no delivery may fail (and be redelivered)")
		require.EqualValues(t, 2*len(unstorable), a.total.Load())
		require.Empty(t, f.downstreamOf(poisonTopic))
		for _, c := range unstorable {
			require.Equal(t, 1, api.callsFor(c.value), "%s: the effect runs once; the redelivery is a duplicate", c.name)
			rec, err := repo.Get(t.Context(), "payments/payments", c.value)
			require.NoError(t, err, c.name)
			require.Equal(t, repository.StateCompleted, rec.State, c.name)
			require.Equal(t, repository.StorageKey(c.value), rec.Key, c.name)
		}
	}
	forEachLeaseStore(t, run)
	forEachPostgresMode(t, func(t *testing.T, s *store) { run(t, s.leaseRepo()) })
}

// TestRouterDataExceptionIsPoisoned: a handler whose own write carries a
// value the database refuses (a NUL byte, invalid UTF-8, both, in text)
// fails the same way on every redelivery, so IsPermanent sends it to the
// poison queue at once instead of letting it loop. The transaction rolls
// back: no marker, no effect. PostgreSQL runs in every pgx query exec
// mode on both drivers: in simple_protocol pgx quotes the value into the
// statement, and the server answers a NUL byte with 08P01, not 22021.
func TestRouterDataExceptionIsPoisoned(t *testing.T) {
	run := func(t *testing.T, s *store, refused map[string]string) {
		f := newFlow(t)
		poison, err := wmiddleware.PoisonQueueWithFilter(f.pubSub, poisonTopic, idempotency.IsPermanent)
		require.NoError(t, err)
		var a attempts
		f.router.AddMiddleware(a.middleware, poison, s.newInbox(t, "billing").Middleware)
		var runs atomic.Int64
		f.router.AddConsumerHandler("billing", ordersTopic, f.pubSub, func(msg *message.Message) error {
			runs.Add(1)
			return s.execInTx(msg.Context(), `INSERT INTO `+s.charges+` (order_id, amount) VALUES (?, 1)`, msg.Metadata.Get("order_id"))
		})
		f.collect(t, poisonTopic)
		f.run(t)

		var bad []string
		for name, orderID := range refused {
			m := message.NewMessage("m-"+name, []byte(name))
			m.Metadata.Set("order_id", orderID)
			f.publish(t, m)
			bad = append(bad, m.UUID)
		}
		good := message.NewMessage("m-good", []byte("good"))
		good.Metadata.Set("order_id", "o-1")
		f.publish(t, good)
		a.waitAcked(t, f, int64(len(refused)+1))
		f.waitDownstream(t, poisonTopic, len(refused))

		require.Zero(t, a.failed.Load(), "the refused write is not redelivered")
		require.EqualValues(t, len(refused)+1, a.total.Load())
		var poisoned []string
		for _, m := range f.downstreamOf(poisonTopic) {
			poisoned = append(poisoned, m.UUID)
		}
		require.ElementsMatch(t, bad, poisoned, "each refused write is poisoned once")
		require.EqualValues(t, len(refused)+1, runs.Load())
		require.Equal(t, 1, s.totalCharges(t))
		for _, uuid := range bad {
			_, err = s.repo.Get(t.Context(), "billing/billing", uuid)
			require.ErrorIs(t, err, repository.ErrNotFound, "%s: the marker rolled back with the write", uuid)
		}
	}
	forEachStore(t, func(t *testing.T, s *store) {
		// MySQL's text takes a NUL byte; utf8mb4 refuses invalid UTF-8.
		run(t, s, map[string]string{"invalid-utf8": "o-\xff", "nul-and-invalid-utf8": "o-\x00\xff"})
	}, "mysql")
	forEachPostgresMode(t, func(t *testing.T, s *store) {
		run(t, s, map[string]string{"nul": "o-\x00", "invalid-utf8": "o-\xff", "nul-and-invalid-utf8": "o-\x00\xff"})
	})
}

// TestBatchDataExceptionIsPermanent: in a group commit, a handler write
// the database refuses fails its own delivery alone, with an error
// IsPermanent recognises, on PostgreSQL in every pgx query exec mode on
// both drivers; the others commit, in its transaction or without it.
func TestBatchDataExceptionIsPermanent(t *testing.T) {
	forEachPostgresMode(t, func(t *testing.T, s *store) {
		inbox := s.newInbox(t, "billing", batched(8, 50*time.Millisecond))
		mw := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			return nil, s.execInTx(msg.Context(), `INSERT INTO `+s.charges+` (order_id, amount) VALUES (?, 1)`, msg.Metadata.Get("order_id"))
		})
		refused := map[string]bool{}
		var msgs []*message.Message
		for k, orderID := range []string{"o-1", "o-\x00", "o-2", "o-\xff", "o-3", "o-\x00\xff"} {
			m := message.NewMessage(fmt.Sprintf("m-%d", k), []byte(orderID))
			m.Metadata.Set("order_id", orderID)
			refused[m.UUID] = !utf8.ValidString(orderID) || strings.Contains(orderID, "\x00")
			msgs = append(msgs, m)
		}
		_, errs := deliverConcurrently(mw, msgs)
		for k, m := range msgs {
			if refused[m.UUID] {
				require.True(t, idempotency.IsPermanent(errs[k]), "%s: %v", m.UUID, errs[k])
				continue
			}
			require.NoError(t, errs[k], m.UUID)
		}
		require.Equal(t, 3, s.totalCharges(t))
	})
}

func TestIsPermanentForInputTheStoreRefuses(t *testing.T) {
	for _, err := range []error{
		storekit.ValidateConsumer("bill\x00ing"),
		storekit.ValidateConsumer("bill\xffing"),
		fmt.Errorf("version guard: %w", repository.ErrInvalidParams),
	} {
		require.True(t, idempotency.IsPermanent(err), "%v", err)
	}
	for _, err := range []error{
		repository.ErrLeaseLost,
		repository.ErrNotFound,
		idempotency.ErrInProgress,
		context.DeadlineExceeded,
		errors.New("handler failed"),
	} {
		require.False(t, idempotency.IsPermanent(fmt.Errorf("wrapped: %w", err)), "%v", err)
	}
}
