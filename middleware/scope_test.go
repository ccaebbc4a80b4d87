package middleware_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// scopeObserver records, per delivery scope (Delivery.Consumer), the
// outcomes an inbox reported.
type scopeObserver struct {
	mu     sync.Mutex
	counts map[string]map[idempotency.Outcome]int
}

func (o *scopeObserver) ObserveDelivery(_ context.Context, d idempotency.Delivery) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counts == nil {
		o.counts = map[string]map[idempotency.Outcome]int{}
	}
	if o.counts[d.Scope] == nil {
		o.counts[d.Scope] = map[idempotency.Outcome]int{}
	}
	o.counts[d.Scope][d.Outcome]++
}

func (o *scopeObserver) get(scope string, outcome idempotency.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[scope][outcome]
}

// TestInboxesRequireConsumer: an inbox without Consumer is refused at
// construction, by NewInbox, NewTwoPhaseInbox and Validate, with an error
// that says why (services sharing a table would suppress each other's
// messages) and how to keep the keys stored under the bare handler name.
func TestInboxesRequireConsumer(t *testing.T) {
	s := newSQLiteStore(t)
	twoPhaseRepo := s.leaseRepo()
	config := middleware.Config{}
	twoPhase := middleware.TwoPhaseConfig{Repository: twoPhaseRepo}
	_, newErr := middleware.NewInbox(s.repo, config)
	_, newTwoPhaseErr := middleware.NewTwoPhaseInbox(twoPhase)
	for name, c := range map[string]struct {
		err    error
		config string
	}{
		"NewInbox":                {newErr, "Config"},
		"Config.Validate":         {config.Validate(), "Config"},
		"NewTwoPhaseInbox":        {newTwoPhaseErr, "TwoPhaseConfig"},
		"TwoPhaseConfig.Validate": {twoPhase.Validate(), "TwoPhaseConfig"},
		"Config.Validate, only HandlerScopes": {middleware.Config{
			HandlerScopes: map[string]string{"billing": "billing"}}.Validate(), "Config"},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorContains(t, c.err, "missing "+c.config+".Consumer: set it to the name of this service")
			require.ErrorContains(t, c.err, "services sharing the inbox table never suppress each other's messages")
			require.ErrorContains(t, c.err, `HandlerScopes: map[string]string{"billing": "billing"}`, "the error says how to keep old keys")
		})
	}
	config.Consumer, twoPhase.Consumer = "payments", "payments"
	_, err := middleware.NewInbox(s.repo, config)
	require.NoError(t, err)
	_, err = middleware.NewTwoPhaseInbox(twoPhase)
	require.NoError(t, err)
}

// Without a router, a delivery has no handler name: Consumer alone is its
// scope, in both modes.
func TestInboxWithoutHandlerNameUsesConsumer(t *testing.T) {
	for _, mode := range inboxModes {
		t.Run(mode.name, func(t *testing.T) {
			s := newSQLiteStore(t)
			var runs atomic.Int64
			mw := mode.new(t, s, "payments")(func(msg *message.Message) ([]*message.Message, error) {
				runs.Add(1)
				return nil, nil
			})
			for range 2 {
				_, err := mw(orderMessage("uuid-1", order{ID: "o-1", Amount: 1}))
				require.NoError(t, err)
			}
			require.EqualValues(t, 1, runs.Load(), "the copy is a duplicate")
			rec, err := s.repo.Get(t.Context(), "payments", "uuid-1")
			require.NoError(t, err)
			require.Equal(t, repository.StateCompleted, rec.State)
		})
	}
}

// writeLegacyRecords stores msgs as processed under scope, the way an
// inbox of an earlier version did: a completed record per (scope, UUID)
// with the payload's hash.
func writeLegacyRecords(t *testing.T, s *store, scope string, msgs []*message.Message) {
	t.Helper()
	now := time.Now()
	for _, m := range msgs {
		tx, err := s.db.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		claims, err := s.repo.Claim(t.Context(), tx, []repository.ClaimParams{{
			Consumer: scope, Key: m.UUID, PayloadHash: repository.HashPayload(m.Payload),
			Now: now, ExpiresAt: now.Add(idempotency.DefaultRetention),
		}})
		require.NoError(t, err)
		require.True(t, claims[0].Claimed)
		require.NoError(t, tx.Commit())
	}
}

// upgradeRun runs handler "billing" under a router-wide inbox built by
// mw, publishes msgs, waits until all are acknowledged and returns how
// often the handler ran.
func upgradeRun(t *testing.T, mw message.HandlerMiddleware, msgs []*message.Message) int64 {
	t.Helper()
	f := newFlow(t)
	var runs atomic.Int64
	f.router.AddMiddleware(f.count, mw)
	f.router.AddConsumerHandler("billing", ordersTopic, f.pubSub, func(*message.Message) error {
		runs.Add(1)
		return nil
	})
	f.run(t)
	for _, m := range msgs {
		f.publish(t, m.Copy())
	}
	f.waitCompleted(t, len(msgs))
	return runs.Load()
}

// TestUpgradeKeepsBareHandlerScopes: an earlier version without Consumer
// stored handler "billing"'s keys under scope "billing". After the
// upgrade, with Consumer required, the one-line mapping
// HandlerScopes{"billing": "billing"} keeps them: every redelivery is a
// duplicate. Without it the scope is "payments/billing", which has never
// seen these keys, so they run once more.
func TestUpgradeKeepsBareHandlerScopes(t *testing.T) {
	for _, b := range []struct {
		name string
		open func(testing.TB) *store
	}{{"sqlite", newSQLiteStore}, {"postgres", newPostgresStore}} {
		for _, mode := range inboxModes {
			t.Run(b.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				s := b.open(t)
				var msgs []*message.Message
				for i := range 5 {
					msgs = append(msgs, orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 1}))
				}
				writeLegacyRecords(t, s, "billing", msgs)

				upgraded := s.newInbox(t, "payments", func(c *middleware.Config) {
					c.HandlerScopes = map[string]string{"billing": "billing"}
				}).Middleware
				if mode.name == "two-phase" {
					repo := s.leaseRepo()
					inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: repo, Consumer: "payments",
						HandlerScopes: map[string]string{"billing": "billing"}})
					require.NoError(t, err)
					upgraded = inbox.Middleware
				}
				require.Zero(t, upgradeRun(t, upgraded, msgs), "every redelivery is a duplicate of the earlier version's run")

				require.EqualValues(t, len(msgs), upgradeRun(t, mode.new(t, s, "payments"), msgs),
					"without the mapping the keys are forgotten")
				_, err := s.repo.Get(t.Context(), "payments"+middleware.ScopeSeparator+"billing", "uuid-0")
				require.NoError(t, err)
			})
		}
	}
}

// TestTwoServicesShareTableAndTopic is issue 24's reproduction: two
// services, each wired like the README's router (one inbox for the whole
// router, a handler named "billing"), share one inbox table and consume
// one fan-out topic. Each service's own Consumer keeps their scopes
// apart, so each runs every event once. The legacy mapping to the bare
// handler name (what an inbox without Consumer used to do) shares the
// scope: each event then runs once in all, in whichever service claimed
// it first, and the other acknowledges it as a duplicate.
func TestTwoServicesShareTableAndTopic(t *testing.T) {
	services := []string{"payments", "analytics"}
	const orders, copies = 20, 2
	for name, b := range fanoutBackends {
		for _, mode := range inboxModes {
			t.Run(name+"/"+mode.name, func(t *testing.T) {
				if testing.Short() && strings.HasPrefix(name, "rabbitmq") {
					t.Skip("RabbitMQ fan-out runs take seconds; skipped with -short")
				}
				t.Parallel()
				s, bus, input := b.store(t), b.bus(t), randomName("orders")
				var routers []*fanout
				for _, service := range services {
					f := newServiceFanout(t, bus, input, service, mode.new(t, s, service), "billing")
					f.effect = chargeEffect(s)
					f.start(t)
					routers = append(routers, f)
				}
				routers[0].publish(t, orders, copies)
				for i, f := range routers {
					f.wait(t, orders*copies)
					f.requireEachHandlerOnce(t, orders, copies)
					require.Equal(t, map[string]bool{services[i] + middleware.ScopeSeparator + "billing": true}, f.scopes["billing"])
					_, err := s.repo.Get(t.Context(), services[i]+middleware.ScopeSeparator+"billing", input+"-uuid-0")
					require.NoError(t, err, "%s's record is stored under its scope", services[i])
				}
				if mode.name == "transactional" {
					require.Equal(t, orders*len(services), s.totalCharges(t), "each service charged every order")
				}
			})
		}
	}

	t.Run("legacy mapping shares the scope", func(t *testing.T) {
		t.Parallel()
		s, bus, input := newSQLiteStore(t), goChannelBus(t), randomName("orders")
		var routers []*fanout
		for _, service := range services {
			inbox := s.newInbox(t, service, func(c *middleware.Config) { c.HandlerScopes = map[string]string{"billing": "billing"} })
			f := newServiceFanout(t, bus, input, service, inbox.Middleware, "billing")
			f.start(t)
			routers = append(routers, f)
		}
		routers[0].publish(t, orders, copies)
		runs := 0
		for _, f := range routers {
			f.wait(t, orders*copies)
			f.log(t, orders, copies)
			f.mu.Lock()
			for _, n := range f.runs["billing"] {
				runs += n
			}
			f.mu.Unlock()
		}
		require.Equal(t, orders, runs, "one scope: each order ran in one service only")
	})
}

// renameRun runs one router generation: handler name under a router-wide
// inbox built by mw, on a fresh GoChannel over the same store. It
// publishes msgs, waits until all are acknowledged and returns how often
// the handler ran and the UUIDs of the outputs published.
func renameRun(t *testing.T, name string, mw message.HandlerMiddleware, msgs []*message.Message) (runs int64, outputs map[string]bool) {
	t.Helper()
	f := newFlow(t)
	var n atomic.Int64
	f.router.AddMiddleware(f.count, mw)
	f.router.AddHandler(name, ordersTopic, f.pubSub, paymentsTopic, f.pubSub, func(msg *message.Message) ([]*message.Message, error) {
		n.Add(1)
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("paid "+msg.UUID))}, nil
	})
	f.collect(t, paymentsTopic)
	f.run(t)
	for _, m := range msgs {
		f.publish(t, m.Copy())
	}
	f.waitCompleted(t, len(msgs))
	f.waitDownstream(t, paymentsTopic, len(msgs))
	outputs = map[string]bool{}
	for _, m := range f.downstreamOf(paymentsTopic) {
		outputs[m.UUID] = true
	}
	return n.Load(), outputs
}

// TestHandlerScopesKeepKeysAcrossRenames: keys stored under an earlier
// version's Consumer (the middleware's scope before it was per handler)
// and keys of a renamed handler are kept by mapping the handler name with
// HandlerScopes; without the mapping a renamed handler forgets them.
func TestHandlerScopesKeepKeysAcrossRenames(t *testing.T) {
	s := newSQLiteStore(t)
	var msgs []*message.Message
	for i := range 5 {
		msgs = append(msgs, orderMessage(fmt.Sprintf("uuid-%d", i), order{ID: fmt.Sprintf("o-%d", i), Amount: 1}))
	}
	inbox := func(mutate ...func(*middleware.Config)) message.HandlerMiddleware {
		return s.newInbox(t, "billing", mutate...).Middleware
	}

	// What an earlier version stored: records under Consumer "billing".
	var firstRuns int64
	first := map[string]bool{}
	legacy := inbox()(func(msg *message.Message) ([]*message.Message, error) {
		firstRuns++
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("paid "+msg.UUID))}, nil
	})
	for _, m := range msgs {
		out, err := legacy(m.Copy())
		require.NoError(t, err)
		first[out[0].UUID] = true
	}
	require.EqualValues(t, 5, firstRuns)

	// Upgraded, handler "billing", keys kept with {"billing": "billing"}.
	runs, outputs := renameRun(t, "billing", inbox(func(c *middleware.Config) {
		c.HandlerScopes = map[string]string{"billing": "billing"}
	}), msgs)
	require.Zero(t, runs, "every message is a duplicate of the earlier version's run")
	require.Equal(t, first, outputs, "the stored outputs are replayed")

	// Handler renamed to "charge-card", mapped to the same scope.
	runs, outputs = renameRun(t, "charge-card", inbox(func(c *middleware.Config) {
		c.HandlerScopes = map[string]string{"charge-card": "billing"}
	}), msgs)
	require.Zero(t, runs)
	require.Equal(t, first, outputs)

	// Renamed without a mapping: scope "billing/charge-card" has never
	// seen these keys, so they run once more.
	runs, outputs = renameRun(t, "charge-card", inbox(), msgs)
	require.EqualValues(t, 5, runs, "a renamed handler forgets its keys")
	require.Len(t, outputs, 5)
	for u := range outputs {
		require.NotContains(t, first, u)
	}
	_, err := s.repo.Get(t.Context(), "billing"+middleware.ScopeSeparator+"charge-card", "uuid-0")
	require.NoError(t, err)
}

// TestInvalidHandlerScopeIsPermanent: a handler whose derived scope cannot
// be stored fails every delivery with ErrInvalidScope, which the poison
// queue takes — never a transient error retried forever — while the
// router's other handlers go on.
func TestInvalidHandlerScopeIsPermanent(t *testing.T) {
	bad := map[string]string{
		strings.Repeat("h", 260): "is 265 bytes, longer than 255",
		"bad\x00name":            "contains a NUL byte",
		"bad\xffname":            "is not valid UTF-8",
	}
	for _, mode := range inboxModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			s := newSQLiteStore(t)
			f := newFlow(t)
			poison, err := wmiddleware.PoisonQueueWithFilter(f.pubSub, poisonTopic, idempotency.IsPermanent)
			require.NoError(t, err)
			f.router.AddMiddleware(f.count, poison, mode.new(t, s, "shop"))
			var badRuns, goodRuns atomic.Int64
			for name := range bad {
				f.router.AddConsumerHandler(name, ordersTopic, f.pubSub, func(*message.Message) error {
					badRuns.Add(1)
					return nil
				})
			}
			f.router.AddConsumerHandler("billing", ordersTopic, f.pubSub, func(*message.Message) error {
				goodRuns.Add(1)
				return nil
			})
			f.collect(t, poisonTopic)
			f.run(t)

			f.publish(t, orderMessage("uuid-1", order{ID: "o-1", Amount: 1}))
			f.waitCompleted(t, 1+len(bad)) // the poison queue acknowledges what it takes
			f.waitDownstream(t, poisonTopic, len(bad))

			require.Zero(t, badRuns.Load())
			require.EqualValues(t, 1, goodRuns.Load())
			reasons := map[string]bool{}
			for _, m := range f.downstreamOf(poisonTopic) {
				reasons[m.Metadata.Get(wmiddleware.ReasonForPoisonedKey)] = true
			}
			require.Len(t, reasons, len(bad))
			for _, want := range bad {
				found := false
				for reason := range reasons {
					if strings.Contains(reason, idempotency.ErrInvalidScope.Error()) && strings.Contains(reason, want) {
						found = true
					}
				}
				require.True(t, found, "a poisoned message says the scope %s: %v", want, reasons)
			}
		})
	}
}

// captureOutputs is an OutputWriter that keeps what it is given.
type captureOutputs struct {
	mu    sync.Mutex
	uuids map[string][]string // handler → output UUIDs
}

func (c *captureOutputs) WriteOutputs(ctx context.Context, msgs []*message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := message.HandlerNameFromCtx(ctx)
	for _, m := range msgs {
		c.uuids[h] = append(c.uuids[h], m.UUID)
	}
	return nil
}

// With Outputs, each output gets OutputUUID(scope, key, position): two
// handlers handling one message produce different UUIDs, so a downstream
// inbox never takes one handler's output for a duplicate of the other's.
func TestOutputUUIDUsesTheScope(t *testing.T) {
	s := newSQLiteStore(t)
	outputs := &captureOutputs{uuids: map[string][]string{}}
	f := newFlow(t)
	f.router.AddMiddleware(f.count, s.newInbox(t, "shop", func(c *middleware.Config) { c.Outputs = outputs }).Middleware)
	for _, name := range []string{"billing", "audit"} {
		f.router.AddHandler(name, ordersTopic, f.pubSub, paymentsTopic, f.pubSub, func(msg *message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), nil)}, nil
		})
	}
	f.run(t)
	f.publish(t, orderMessage("uuid-1", order{ID: "o-1", Amount: 1}))
	f.waitCompleted(t, 2)

	outputs.mu.Lock()
	defer outputs.mu.Unlock()
	require.Equal(t, []string{middleware.OutputUUID("shop/billing", "uuid-1", 0)}, outputs.uuids["billing"])
	require.Equal(t, []string{middleware.OutputUUID("shop/audit", "uuid-1", 0)}, outputs.uuids["audit"])
	require.NotEqual(t, outputs.uuids["billing"], outputs.uuids["audit"])
}

// versionSetup is an inbox repository and a version store on one
// database.
type versionSetup struct {
	d     dialect
	repo  sqlRepo
	guard repository.VersionGuard[*sql.Tx]
}

func newVersionSetup(t *testing.T, d dialect) versionSetup {
	inboxTable, versionsTable := randomName("inbox"), randomName("versions")
	v := versionSetup{d: d}
	switch d.name {
	case "postgres":
		r, err := postgres.NewRepository(d.db, postgres.Config{Table: inboxTable})
		require.NoError(t, err)
		require.NoError(t, r.Migrate(t.Context()))
		g, err := postgres.NewVersionStore(d.db, postgres.VersionConfig{Table: versionsTable})
		require.NoError(t, err)
		require.NoError(t, g.Migrate(t.Context()))
		v.repo, v.guard = r, g
	case "sqlite":
		r, err := sqlite.NewRepository(d.db, sqlite.Config{Table: inboxTable})
		require.NoError(t, err)
		require.NoError(t, r.Migrate(t.Context()))
		g, err := sqlite.NewVersionStore(d.db, sqlite.VersionConfig{Table: versionsTable})
		require.NoError(t, err)
		require.NoError(t, g.Migrate(t.Context()))
		v.repo, v.guard = r, g
	default:
		t.Fatalf("no version setup for %s", d.name)
	}
	t.Cleanup(func() {
		for _, table := range []string{inboxTable, versionsTable} {
			_, err := d.db.Exec(`DROP TABLE IF EXISTS ` + table)
			require.NoError(t, err)
		}
	})
	return v
}

// TestVersionGuardTwoHandlers: two handlers of one router guard the same
// entity with one VersionGuard (no Consumer of its own). Each applies
// every version once and finds only its own stale messages stale: the
// versions are kept per delivery scope. In two-phase mode the handlers use
// ApplyIfNewerTx with their own transaction and the scope from the
// context.
func TestVersionGuardTwoHandlers(t *testing.T) {
	for _, d := range []struct {
		name string
		open func(testing.TB) *sql.DB
	}{{"sqlite", testenv.SQLite}, {"postgres", testenv.Postgres}} {
		for _, mode := range []string{"transactional", "two-phase"} {
			t.Run(d.name+"/"+mode, func(t *testing.T) {
				t.Parallel()
				v := newVersionSetup(t, dialect{name: d.name, db: d.open(t)})
				guard, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[*sql.Tx]{Guard: v.guard})
				require.NoError(t, err)
				obs := &scopeObserver{}
				var mw message.HandlerMiddleware
				if mode == "transactional" {
					inbox, err := middleware.NewInbox(v.repo, middleware.Config{Consumer: "shop", Observer: obs})
					require.NoError(t, err)
					mw = inbox.Middleware
				} else {
					inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: v.repo, Consumer: "shop", Observer: obs})
					require.NoError(t, err)
					mw = inbox.Middleware
				}

				var mu sync.Mutex
				applied := map[string][]int64{} // handler → versions applied, in order
				project := func(name string) message.NoPublishHandlerFunc {
					return func(msg *message.Message) error {
						var u entityUpdate
						if err := json.Unmarshal(msg.Payload, &u); err != nil {
							return err
						}
						ctx := msg.Context()
						if mode == "transactional" {
							if err := guard.ApplyIfNewer(ctx, u.Entity, u.Version); err != nil {
								return err
							}
						} else {
							tx, err := v.d.db.BeginTx(ctx, nil)
							if err != nil {
								return err
							}
							if err := guard.ApplyIfNewerTx(ctx, tx, u.Entity, u.Version); err != nil {
								_ = tx.Rollback()
								return err
							}
							if err := tx.Commit(); err != nil {
								return err
							}
						}
						mu.Lock()
						applied[name] = append(applied[name], u.Version)
						mu.Unlock()
						return nil
					}
				}

				f := newFlow(t)
				f.router.AddMiddleware(f.count, mw)
				for _, name := range []string{"orders-view", "search-index"} {
					f.router.AddConsumerHandler(name, ordersTopic, f.pubSub, project(name))
				}
				f.run(t)

				// Versions 1..4 one after the other, then version 2 again under
				// a new UUID: stale for both handlers.
				update := func(version int64) *message.Message {
					payload, err := json.Marshal(entityUpdate{Entity: "order-1", Version: version})
					require.NoError(t, err)
					return message.NewMessage(watermill.NewUUID(), payload)
				}
				for i, version := range []int64{1, 2, 3, 4, 2} {
					f.publish(t, update(version))
					f.waitCompleted(t, 2*(i+1))
				}

				mu.Lock()
				defer mu.Unlock()
				for _, name := range []string{"orders-view", "search-index"} {
					require.Equal(t, []int64{1, 2, 3, 4}, applied[name], "%s applied every version once, in order", name)
					scope := "shop" + middleware.ScopeSeparator + name
					require.Equal(t, 4, obs.get(scope, idempotency.OutcomeProcessed))
					require.Equal(t, 1, obs.get(scope, idempotency.OutcomeStaleVersion), "%s: only the republished version 2 is stale", name)
				}
			})
		}
	}
}

// Outside any inbox the guard needs its own Consumer as the scope.
func TestVersionGuardScopeOutsideTheInbox(t *testing.T) {
	db := testenv.SQLite(t)
	v := newVersionSetup(t, dialect{name: "sqlite", db: db})
	unscoped, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[*sql.Tx]{Guard: v.guard})
	require.NoError(t, err)
	tx, err := db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	err = unscoped.ApplyIfNewerTx(t.Context(), tx, "order-1", 1)
	require.ErrorIs(t, err, idempotency.ErrNoScope)
	require.True(t, idempotency.IsPermanent(err))

	scoped, err := middleware.NewVersionGuard(middleware.VersionGuardConfig[*sql.Tx]{Guard: v.guard, Consumer: "projector"})
	require.NoError(t, err)
	require.NoError(t, scoped.ApplyIfNewerTx(t.Context(), tx, "order-1", 1))
	require.ErrorIs(t, scoped.ApplyIfNewerTx(t.Context(), tx, "order-1", 1), middleware.ErrStaleVersion)

	_, err = middleware.NewVersionGuard(middleware.VersionGuardConfig[*sql.Tx]{Guard: v.guard, Consumer: "bad\x00"})
	require.ErrorContains(t, err, "VersionGuardConfig.Consumer contains a NUL byte")
	require.False(t, errors.Is(err, idempotency.ErrNoScope))
}
