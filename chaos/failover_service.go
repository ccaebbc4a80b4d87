package chaos

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/watermill-idempotent/health"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// Drivers of the service measurement.
const (
	DriverStdlib  = "database/sql (pgx stdlib)"
	DriverPgxpool = "pgxpool"
)

// serviceNotifyPoll is the notified relay's poll interval in the service
// measurement: long, so that only a LISTEN connection that came back
// delivers its rows quickly.
const serviceNotifyPoll = 30 * time.Second

// serviceDeadline bounds how long the components get to resume after the
// promotion.
const serviceDeadline = time.Minute

// ServiceResult is how long one service's components took to resume on
// the new primary, measured from the end of the promotion; a negative
// duration means never (within a minute).
type ServiceResult struct {
	Driver string
	// Inbox: the first delivery committed. RelayNotify, RelayPoll: the
	// first output committed after the promotion and published, by the
	// relay with a Notifier (PollInterval 30 s) and the polling one.
	// Janitor: the first successful batch. Ready: readiness ok again.
	Inbox, RelayNotify, RelayPoll, Janitor, Ready time.Duration
	// NotifyLatency and PollLatency are the median delay from commit to
	// publication of the outputs committed from 3 s after the promotion
	// on: with the LISTEN connection back, milliseconds, not PollInterval.
	NotifyLatency, PollLatency time.Duration
	// Unready is how long after the kill readiness first failed; a
	// negative duration means it never did.
	Unready time.Duration
	// LiveFailed: liveness failed at some point (it must not: a restart
	// fixes nothing here).
	LiveFailed  bool
	PromoteTook time.Duration
}

// OK reports whether every component resumed without a restart and the
// probes saw the outage and the recovery.
func (r ServiceResult) OK() bool {
	for _, d := range []time.Duration{r.Inbox, r.RelayNotify, r.RelayPoll, r.Janitor, r.Ready, r.Unready} {
		if d < 0 {
			return false
		}
	}
	return !r.LiveFailed && r.NotifyLatency < serviceNotifyPoll/2
}

// events records when things happened, by key.
type events struct {
	mu sync.Mutex
	at map[string]time.Time
	// times are the successes of one component, in order.
	times []time.Time
}

func newEvents() *events { return &events{at: map[string]time.Time{}} }

func (e *events) mark(key string) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if key != "" {
		if _, ok := e.at[key]; !ok {
			e.at[key] = now
		}
	}
	e.times = append(e.times, now)
}

// firstAfter is the first success after t, minus t; -1 if none.
func (e *events) firstAfter(t time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, at := range e.times {
		if at.After(t) {
			return at.Sub(t)
		}
	}
	return -1
}

// recorder is the relays' publisher: it remembers when each message was
// first published.
type recorder struct{ *events }

func (r recorder) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		r.mark(string(m.Payload)) // the input's UUID: see newService's handler
	}
	return nil
}

func (recorder) Close() error { return nil }

// service is one process's components on one driver.
type service struct {
	inboxes [2]message.HandlerFunc // outputs to the notified relay's outbox, the polling one's
	relays  [2]*outbox.Relay
	janitor *janitor.Janitor
	health  *health.Handler
	closers []func()
}

func runService(parent context.Context, config FailoverConfig, pr pair, driver string) (_ *ServiceResult, err error) {
	ctx, cancel := context.WithTimeout(parent, config.Timeout)
	defer cancel()
	say := func(format string, args ...any) {
		fmt.Fprintf(config.Out, "chaos: service on "+driver+": "+format+"\n", args...)
	}
	say("resetting the pair")
	if err := pr.reset(ctx, Async); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "chaos_s" + hex.EncodeToString(b[:])
	committed := [2]*events{newEvents(), newEvents()}
	published, batches, probes := newEvents(), newEvents(), newEvents()
	jh := health.NewJanitorStatus()
	svc, err := newService(ctx, pr.DSN("chaos-service"), driver, prefix, recorder{published}, func(b janitor.Batch) {
		jh.ObserveJanitorBatch(ctx, b)
		if b.Err == nil {
			batches.mark("")
		}
	}, jh)
	for _, c := range svc.closers {
		defer c()
	}
	if err != nil {
		return nil, err
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	for i, h := range svc.inboxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				dctx, cancel := context.WithTimeout(runCtx, 5*time.Second)
				msg.SetContext(dctx)
				_, err := h(msg)
				cancel()
				if err == nil {
					committed[i].mark(msg.UUID)
				}
				_ = sleep(runCtx, 25*time.Millisecond)
			}
		}()
	}
	for _, r := range svc.relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Run(runCtx)
		}()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = svc.janitor.Run(runCtx)
	}()
	// Liveness fails until the janitor's first batch: it is watched from
	// the end of the warm-up on.
	var liveFailed, watching bool
	var probeMu sync.Mutex
	var readyAt []struct {
		at time.Time
		ok bool
	}
	go func() {
		defer wg.Done()
		for runCtx.Err() == nil {
			r := svc.health.Ready(runCtx)
			l := svc.health.Live(runCtx)
			now := time.Now()
			probeMu.Lock()
			readyAt = append(readyAt, struct {
				at time.Time
				ok bool
			}{now, r.Status == health.StatusOK})
			if l.Status != health.StatusOK && watching && runCtx.Err() == nil {
				liveFailed = true
			}
			probeMu.Unlock()
			if r.Status == health.StatusOK {
				probes.mark("")
			}
			_ = sleep(runCtx, 100*time.Millisecond)
		}
	}()

	// Every component works before the failover.
	warm := time.Now()
	if err := waitUntil(ctx, 30*time.Second, func() bool {
		return committed[0].firstAfter(warm) >= 0 && committed[1].firstAfter(warm) >= 0 && published.firstAfter(warm) >= 0 &&
			batches.firstAfter(warm) >= 0 && probes.firstAfter(warm.Add(time.Second)) >= 0
	}); err != nil {
		return nil, fmt.Errorf("the service did not start: %w", err)
	}
	probeMu.Lock()
	watching = true
	probeMu.Unlock()
	_ = sleep(ctx, time.Second)

	if err := pr.a.crash(); err != nil {
		return nil, err
	}
	killedAt := time.Now()
	say("primary killed")
	_ = sleep(ctx, config.PromoteAfter)
	before := time.Now()
	if err := pr.promote(ctx); err != nil {
		return nil, err
	}
	promotedAt := time.Now()
	res := &ServiceResult{Driver: driver, PromoteTook: promotedAt.Sub(before)}
	say("replica promoted in %s", ms(res.PromoteTook))

	relayed := func(i int) (first, median time.Duration) {
		committed[i].mu.Lock()
		defer committed[i].mu.Unlock()
		published.mu.Lock()
		defer published.mu.Unlock()
		first = -1
		var lat []time.Duration
		for id, c := range committed[i].at {
			p, ok := published.at[id]
			if !ok || !c.After(promotedAt) {
				continue
			}
			if d := p.Sub(promotedAt); first < 0 || d < first {
				first = d
			}
			if c.After(promotedAt.Add(3 * time.Second)) {
				lat = append(lat, p.Sub(c))
			}
		}
		if len(lat) == 0 {
			return first, -1
		}
		slices.Sort(lat)
		return first, lat[len(lat)/2]
	}
	resumed := func() bool {
		n, _ := relayed(0)
		p, _ := relayed(1)
		return committed[0].firstAfter(promotedAt) >= 0 && committed[1].firstAfter(promotedAt) >= 0 &&
			n >= 0 && p >= 0 && batches.firstAfter(promotedAt) >= 0 && probes.firstAfter(promotedAt) >= 0
	}
	// A deadline, not a failure: what did not resume is reported.
	_ = waitUntil(ctx, serviceDeadline, resumed)
	// Then long enough for the steady relay latencies.
	_ = sleep(ctx, time.Until(promotedAt.Add(6*time.Second)))
	stop()
	wg.Wait()

	res.Inbox = min(committed[0].firstAfter(promotedAt), committed[1].firstAfter(promotedAt))
	if res.Inbox < 0 {
		res.Inbox = max(committed[0].firstAfter(promotedAt), committed[1].firstAfter(promotedAt))
	}
	res.RelayNotify, res.NotifyLatency = relayed(0)
	res.RelayPoll, res.PollLatency = relayed(1)
	res.Janitor = batches.firstAfter(promotedAt)
	res.LiveFailed = liveFailed
	res.Unready, res.Ready = -1, -1
	for _, r := range readyAt {
		if r.at.After(killedAt) && !r.ok && res.Unready < 0 {
			res.Unready = r.at.Sub(killedAt)
		}
		if r.at.After(promotedAt) && r.ok && res.Unready >= 0 && res.Ready < 0 {
			res.Ready = r.at.Sub(promotedAt)
		}
	}
	say("inbox %s, relay with NOTIFY %s (then %s), polling relay %s (then %s), janitor %s, unready %s after the kill, ready %s after the promotion",
		ms(res.Inbox), ms(res.RelayNotify), ms(res.NotifyLatency), ms(res.RelayPoll), ms(res.PollLatency), ms(res.Janitor), ms(res.Unready), ms(res.Ready))
	return res, nil
}

// newService builds the components on driver over dsn: two inboxes
// (writing to the outboxes of a relay with a Notifier and of a polling
// one), the two relays, a janitor and the health probes. The closers
// are returned even with an error.
func newService(ctx context.Context, dsn, driver, prefix string, pub message.Publisher, onBatch func(janitor.Batch), jh *health.JanitorStatus) (*service, error) {
	svc := &service{}
	var db *sql.DB
	var cleaner repository.Cleaner // the inbox's repository, on driver
	var err error
	obs := [2]*outbox.Outbox{}
	for i, suffix := range []string{"_obn", "_obp"} {
		if obs[i], err = outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL, Table: prefix + suffix}); err != nil {
			return svc, err
		}
	}
	// The output carries the input's UUID as its payload (the inbox
	// gives outputs their own deterministic UUIDs).
	handler := func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(msg.UUID))}, nil
	}
	relayConfig := func(i int) outbox.RelayConfig {
		c := outbox.RelayConfig{Dialect: sqldialect.PostgreSQL, Table: prefix + []string{"_obn", "_obp"}[i]}
		if i == 0 {
			c.PollInterval = serviceNotifyPoll
		} else {
			c.DisableNotify = true
		}
		return c
	}
	scopes := [2]string{"svc-notify", "svc-poll"}
	switch driver {
	case DriverStdlib:
		if db, err = openDB(dsn, 12); err != nil {
			return svc, err
		}
		svc.closers = append(svc.closers, func() { _ = db.Close() })
		var repo *postgres.Repository[*sql.Tx]
		if repo, err = postgres.NewRepository(db, postgres.Config{Table: prefix + "_inbox"}); err != nil {
			return svc, err
		}
		if err := repo.Migrate(ctx); err != nil {
			return svc, err
		}
		cleaner = repo
		for i := range obs {
			if err := obs[i].Migrate(ctx, db); err != nil {
				return svc, err
			}
			inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: scopes[i], Outputs: obs[i].Outputs("svc")})
			if err != nil {
				return svc, err
			}
			svc.inboxes[i] = inbox.Middleware(handler)
			c := relayConfig(i)
			if i == 0 {
				c.Notifier = pgxoutbox.Notifier(db)
			}
			if svc.relays[i], err = outbox.NewRelay(db, pub, c); err != nil {
				return svc, err
			}
		}
	case DriverPgxpool:
		pc, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return svc, err
		}
		pc.MaxConns = 12
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return svc, err
		}
		svc.closers = append(svc.closers, pool.Close)
		db = stdlib.OpenDBFromPool(pool)
		svc.closers = append(svc.closers, func() { _ = db.Close() })
		repo, err := postgres.NewPgxRepository(pool, postgres.Config{Table: prefix + "_inbox"})
		if err != nil {
			return svc, err
		}
		if err := repo.Migrate(ctx); err != nil {
			return svc, err
		}
		cleaner = repo
		for i := range obs {
			if err := pgxoutbox.Migrate(ctx, obs[i], pool); err != nil {
				return svc, err
			}
			inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: scopes[i], Outputs: pgxoutbox.Outputs(obs[i], "svc")})
			if err != nil {
				return svc, err
			}
			svc.inboxes[i] = inbox.Middleware(handler)
			// pgxoutbox.NewRelay LISTENs on a pool connection unless
			// DisableNotify.
			if svc.relays[i], err = pgxoutbox.NewRelay(pool, pub, relayConfig(i)); err != nil {
				return svc, err
			}
		}
	default:
		return svc, fmt.Errorf("unknown driver %q", driver)
	}
	if svc.janitor, err = janitor.NewJanitor(cleaner, janitor.Config{Interval: 250 * time.Millisecond, Observer: janitor.ObserverFunc(func(_ context.Context, b janitor.Batch) { onBatch(b) })}); err != nil {
		return svc, err
	}
	svc.closers = append(svc.closers, func() { _ = svc.janitor.Close() })
	svc.health, err = health.NewHandler(health.Config{DB: db, Relay: svc.relays[0], Janitor: jh,
		Timeout: time.Second, MaxJanitorAge: 2 * time.Second})
	return svc, err
}

func waitUntil(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func printServices(w io.Writer, promoteAfter time.Duration, services []ServiceResult) {
	if len(services) == 0 {
		return
	}
	fmt.Fprintf(w, "\nservice on a multi-host DSN (target_session_attrs=read-write), times after the promotion (promotion %s after the SIGKILL):\n\n", promoteAfter)
	fmt.Fprintf(w, "| driver | promote took | readiness failed (after the kill) | inbox | relay, NOTIFY (PollInterval %s) | relay, polling | janitor | readiness ok | commit→publish after 3 s, NOTIFY / polling | liveness stayed ok | verdict |\n", serviceNotifyPoll)
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, s := range services {
		verdict := "OK"
		if !s.OK() {
			verdict = "FAILED"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s | %v | %s |\n", s.Driver, ms(s.PromoteTook), ms(s.Unready),
			ms(s.Inbox), ms(s.RelayNotify), ms(s.RelayPoll), ms(s.Janitor), ms(s.Ready), ms(s.NotifyLatency), ms(s.PollLatency), !s.LiveFailed, verdict)
	}
}
