// Command migrate-deduplicator moves a consumer from Watermill's
// Deduplicator middleware to the inbox in four deployments, and prints
// what each did to the same kinds of traffic. See docs/migrating.md.
//
//	go run ./examples/migrate-deduplicator   # PostgreSQL at POSTGRES_DSN
//
// Every phase receives new orders, one re-sent by its producer under a new
// UUID, one redelivered by the broker under the same UUID, and one whose
// handler fails longer than the Retry middleware's budget, so the broker
// delivers it again; from the second phase on, copies of the previous
// phase's orders arrive too, as they do across a deployment.
//
//  1. before: the Deduplicator with its defaults (Adler-32 of the
//     payload, in memory) — the failed order's redelivery is dropped as
//     "seen": lost.
//  2. prepare: the same Deduplicator, keyed by the payload's SHA-256 and
//     storing its keys in the inbox's table (sharedKeys) — the old
//     behaviour, but its keys outlive the deployment. Copies of what the
//     in-memory store had seen are charged again, as at every restart of
//     the old deployment.
//  3. window: the inbox keyed by the same SHA-256 — it finds the keys the
//     Deduplicator stored, so nothing is charged twice across the switch,
//     and the failed order is retried, not lost.
//  4. after: the inbox keyed by the message UUID, with the SHA-256 still
//     claimed in the inbox transaction (legacyKey) for one redelivery
//     window — the window's copies are recognised although the key
//     changed.
//
// Once that window has passed, drop legacyKey: the inbox keyed by UUID
// alone.
package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemkit/watermill-idempotent/examples/internal/ledger"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

func main() {
	dsn := cmp.Or(os.Getenv("POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, dsn, os.Stdout, true); err != nil {
		log.Fatal(err)
	}
}

// payloadHash is the key the prepared Deduplicator uses, as the inbox's
// KeyFunc: a watermill MessageHasher is a func(*message.Message) (string,
// error), which is what a middleware.KeyFunc is. It is the SHA-256 of the
// whole payload, the value the inbox stores as a record's payload hash,
// so sharedKeys can store it as both.
var payloadHash = middleware.KeyFunc(wmiddleware.NewMessageHasherSHA256(math.MaxInt64))

// retention is how long the inbox keeps a key: at least the broker's and
// the producers' redelivery window.
const retention = 7 * 24 * time.Hour

type order struct {
	ID    string `json:"id"`
	Cents int64  `json:"cents"`
}

// run runs the four phases against the database at dsn and prints a line
// per phase. legacy false leaves legacyKey out of the last phase, to
// show what it prevents.
func run(ctx context.Context, dsn string, w io.Writer, legacy bool) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	repo, err := ledger.Repository(ctx, db) // the inbox's table
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (order_id TEXT NOT NULL, cents BIGINT NOT NULL)`); err != nil {
		return err
	}

	s := &shop{db: db, run: watermill.NewShortUUID()[:8], failing: map[string]int{}}
	phases := []struct {
		name  string
		setup func(router *message.Router) error
	}{
		{"before   (Deduplicator: Adler-32 of the payload, in memory)", func(router *message.Router) error {
			s.deduplicator(router, &wmiddleware.Deduplicator{}) // the defaults
			return nil
		}},
		{"prepare  (Deduplicator: SHA-256 of the payload, in the inbox table)", func(router *message.Router) error {
			dedup := &wmiddleware.Deduplicator{
				KeyFactory: wmiddleware.NewMessageHasherSHA256(math.MaxInt64),
				Repository: sharedKeys{repo: repo, scope: "shop/billing"},
				// Set it: a Deduplicator given as a struct gets 5 ms, not
				// the one minute its comment promises (that is only for a
				// nil *Deduplicator), too short for a database round trip.
				Timeout: 5 * time.Second,
			}
			s.deduplicator(router, dedup)
			return nil
		}},
		{"window   (inbox: key = the same SHA-256 of the payload)", func(router *message.Router) error {
			return s.inbox(router, repo, payloadHash, nil)
		}},
		{"after    (inbox: key = the UUID, the SHA-256 claimed too)", func(router *message.Router) error {
			var extra []message.HandlerMiddleware
			if legacy {
				extra = append(extra, legacyKey(repo, payloadHash))
			}
			return s.inbox(router, repo, middleware.UUIDKey, extra)
		}},
	}
	var previous []*message.Message
	for i, p := range phases {
		sent, err := s.phase(ctx, i+1, previous, p.setup)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		line, err := s.ledger(ctx, sent)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%s\n  %s\n", p.name, line)
		previous = sent
	}
	return nil
}

// shop is the consumer being migrated and the traffic it receives.
type shop struct {
	db     *sql.DB
	run    string // in every order ID, so that runs on one database do not meet
	pubsub *gochannel.GoChannel
	acked  atomic.Int64

	mu      sync.Mutex
	failing map[string]int // order ID → failures left
}

// retry is the Retry middleware: one retry, for errors the inbox does not
// call permanent. An order failing three times in a row outlasts it and
// is nacked, so the broker delivers it again.
func (s *shop) retry() wmiddleware.Retry {
	return wmiddleware.Retry{
		MaxRetries: 1, InitialInterval: time.Millisecond,
		ShouldRetry: func(p wmiddleware.RetryParams) bool { return !idempotency.IsPermanent(p.Err) },
	}
}

// deduplicator sets the router up as before the migration: the
// Deduplicator, then Retry, then the handler on its own statement.
func (s *shop) deduplicator(router *message.Router, dedup *wmiddleware.Deduplicator) {
	router.AddMiddleware(dedup.Middleware, s.retry().Middleware)
	router.AddConsumerHandler("billing", "orders", s.pubsub, s.chargeBefore)
}

// inbox sets the router up as after the migration: the poison queue, then
// Retry, then the inbox (each retry is a new transaction), then the
// middlewares that must run in the inbox transaction, then Recoverer (a
// panic becomes an error the inbox rolls back). Middlewares added first
// run outermost.
func (s *shop) inbox(router *message.Router, repo *postgres.Repository[*sql.Tx], key middleware.KeyFunc, inTx []message.HandlerMiddleware) error {
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Key: key,
		Retention: retention, RedeliveryWindow: retention,
	})
	if err != nil {
		return err
	}
	poison, err := wmiddleware.PoisonQueueWithFilter(s.pubsub, "orders_poison", idempotency.IsPermanent)
	if err != nil {
		return err
	}
	router.AddMiddleware(poison, s.retry().Middleware, inbox.Middleware)
	router.AddMiddleware(inTx...)
	router.AddMiddleware(wmiddleware.Recoverer)
	router.AddConsumerHandler("billing", "orders", s.pubsub, s.charge)
	return nil
}

// sharedKeys is the Deduplicator's ExpiringKeyRepository on the inbox's
// table: each key is claimed under the scope the inbox gives the handler
// ("shop/billing"), with one atomic insert, so the inbox of the next
// deployment, keyed by the same hash, finds it. The key is the payload's
// SHA-256 (payloadHash), which is what the inbox compares a duplicate's
// payload with. It keeps the Deduplicator's semantics, its flaw included:
// the key is taken before the handler runs.
type sharedKeys struct {
	repo  repository.Driver[*sql.Tx]
	scope string
}

// IsDuplicate implements wmiddleware.ExpiringKeyRepository: it claims key
// in a transaction of its own and commits at once.
func (k sharedKeys) IsDuplicate(ctx context.Context, key string) (bool, error) {
	now := time.Now()
	tx, claims, err := k.repo.BeginClaim(ctx, []repository.ClaimParams{{
		Consumer: k.scope, Key: key, PayloadHash: []byte(key), Now: now, ExpiresAt: now.Add(retention),
	}})
	if err != nil {
		return false, err
	}
	if err := k.repo.Commit(ctx, tx); err != nil {
		return false, err
	}
	return !claims[0].Claimed, nil
}

// legacyKey claims the key the previous deployment used (old) in the
// inbox transaction, under the same scope, next to the inbox's own
// claim: a message whose old key was processed is acknowledged without
// running the handler, and a first delivery records its old key too, so
// that instances of the previous deployment still running see it. The
// database decides a race between the two keys as it does for one (the
// second insert waits for the first transaction). Keep it for one
// redelivery window after the switch, then remove it.
func legacyKey(repo repository.Driver[*sql.Tx], old middleware.KeyFunc) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			tx, err := idempotency.Tx[*sql.Tx](ctx)
			if err != nil {
				return nil, err
			}
			scope, _ := idempotency.ScopeFromContext(ctx)
			key, err := old(msg)
			if err != nil {
				return nil, err
			}
			now := time.Now()
			claims, err := repo.Claim(ctx, tx, []repository.ClaimParams{{
				Consumer: scope, Key: key, PayloadHash: repository.HashPayload(msg.Payload),
				Now: now, ExpiresAt: now.Add(retention),
			}})
			if err != nil {
				return nil, err
			}
			if !claims[0].Claimed {
				return nil, nil // processed under the old key: the inbox commits the new one
			}
			return h(msg)
		}
	}
}

// chargeBefore is the handler as it was under the Deduplicator: its own
// statement on the database, outside any transaction the middleware
// knows of.
func (s *shop) chargeBefore(msg *message.Message) error {
	o, err := s.decode(msg)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(msg.Context(), `INSERT INTO charges (order_id, cents) VALUES ($1, $2)`, o.ID, o.Cents)
	return err
}

// charge is the handler behind the inbox: the same statement on the
// inbox's transaction, so the charge and the key commit together.
func (s *shop) charge(msg *message.Message) error {
	o, err := s.decode(msg)
	if err != nil {
		return err
	}
	tx, err := idempotency.Tx[*sql.Tx](msg.Context())
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(msg.Context(), `INSERT INTO charges (order_id, cents) VALUES ($1, $2)`, o.ID, o.Cents)
	return err
}

// decode reads the order and fails it while it has failures left.
func (s *shop) decode(msg *message.Message) (order, error) {
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return o, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing[o.ID] > 0 {
		s.failing[o.ID]--
		return o, fmt.Errorf("order %s: the payment service is unavailable", o.ID)
	}
	return o, nil
}

// phase runs one deployment: a router set up by setup on a fresh broker,
// fed with copies of the previous phase's orders and with four new ones,
// until every delivery was acknowledged. It returns what it sent.
func (s *shop) phase(ctx context.Context, n int, previous []*message.Message, setup func(*message.Router) error) ([]*message.Message, error) {
	s.pubsub = gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer s.pubsub.Close()
	s.acked.Store(0)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	router.AddMiddleware(s.countAcks)
	if err := setup(router); err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	wg.Go(func() { _ = router.Run(runCtx) })
	<-router.Running()

	var sent []*message.Message
	publish := func(m *message.Message) error {
		sent = append(sent, m)
		return s.pubsub.Publish("orders", m.Copy())
	}
	// The previous phase's re-sent and redelivered orders arrive once
	// more after the deployment.
	for _, m := range previous {
		if m.Metadata.Get("copy") != "" && strings.Contains(s.orderID(m), fmt.Sprintf("-p%d-", n-1)) {
			if err := publish(m); err != nil {
				return nil, err
			}
		}
	}
	orders := make([]*message.Message, 4)
	for i := range orders {
		o := order{ID: fmt.Sprintf("%s-p%d-o%d", s.run, n, i+1), Cents: int64(100 * (i + 1))}
		payload, _ := json.Marshal(o)
		orders[i] = message.NewMessage(watermill.NewUUID(), payload)
		if err := publish(orders[i]); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	s.failing[s.orderID(orders[3])] = 3 // outlasts one retry: nacked, then delivered again
	s.mu.Unlock()
	resent := message.NewMessage(watermill.NewUUID(), orders[1].Payload) // the producer re-sent it
	resent.Metadata.Set("copy", "new UUID")
	redelivered := orders[2].Copy() // the broker delivered it again
	redelivered.Metadata.Set("copy", "same UUID")
	for _, m := range []*message.Message{resent, redelivered} {
		if err := publish(m); err != nil {
			return nil, err
		}
	}
	for s.acked.Load() < int64(len(sent)) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %d deliveries (%d acknowledged): %w", len(sent), s.acked.Load(), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return sent, nil
}

// countAcks counts the deliveries the router acknowledges.
func (s *shop) countAcks(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			s.acked.Add(1)
		}
		return out, err
	}
}

func (s *shop) orderID(msg *message.Message) string {
	var o order
	_ = json.Unmarshal(msg.Payload, &o)
	return o.ID
}

// ledger says, for the orders sent in a phase, how many were charged
// once, twice or more, and not at all.
func (s *shop) ledger(ctx context.Context, sent []*message.Message) (string, error) {
	var ids []string
	for _, m := range sent {
		if id := s.orderID(m); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	var once, twice, lost []string
	for _, id := range ids {
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM charges WHERE order_id = $1`, id).Scan(&n); err != nil {
			return "", err
		}
		short := id[strings.Index(id, "-")+1:]
		switch {
		case n == 0:
			lost = append(lost, short)
		case n == 1:
			once = append(once, short)
		default:
			twice = append(twice, short)
		}
	}
	return fmt.Sprintf("%d deliveries of %d orders: charged once %v, more than once %v, never %v",
		len(sent), len(ids), once, twice, lost), nil
}
