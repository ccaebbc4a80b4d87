// Package dupetest injects the duplicates an at-least-once broker
// delivers, so a handler test shows whether the handler is idempotent
// (Watermill issue #131 asks for such a "chaos monkey"). Add one line to a
// test that runs the handler on a router:
//
//	dupes := dupetest.New(dupetest.Config{Seed: 1})
//	router.AddMiddleware(dupes.Middleware) // first: the copies then pass through every other middleware, as redeliveries do
//	…publish, wait for the handler…
//	dupes.Wait() // the late copies have been delivered
//	…assert the effects happened once…
//
// Of the messages a handler receives, a fraction (Config.Fraction) is
// delivered again: some right after the original, some late — after a
// random delay, from another goroutine, out of order with the messages
// that follow. A fraction (Config.FailFirst) of first attempts is failed
// after the handler ran, as a lost acknowledgement or a crash after the
// effect does, so the broker redelivers. A non-idempotent handler doubles
// its effects; one behind an inbox does not.
//
// Decisions come from a random source seeded with Config.Seed, taken in
// the order messages arrive: with one subscriber delivering in order, the
// same seed duplicates and fails the same messages on every run.
//
// A handler behind the inbox that writes with the *sql.DB instead of the
// inbox's transaction passes these checks until one of its attempts fails
// after the write: the inbox rolls back, the write stays, and the
// redelivery writes again. Config.Inbox and Config.State catch it: the
// injector runs the handler inside the inbox, fails first attempts after
// the handler returned and before the inbox commits, and compares the
// message's effect (State) before the attempt and after the rollback:
//
//	dupes := dupetest.New(dupetest.Config{
//		FailFirst: 1,
//		Inbox:     inbox.Middleware, // instead of router.AddMiddleware(inbox.Middleware)
//		State: func(msg *message.Message) (any, error) {
//			var n int
//			err := db.QueryRowContext(msg.Context(), `SELECT count(*) FROM orders WHERE id = $1`, msg.UUID).Scan(&n)
//			return n, err
//		},
//	})
//	router.AddMiddleware(dupes.Middleware)
//	…
//	require.Empty(t, dupes.Stats().RollbackErrors) // ErrOutsideTx: the handler writes outside the transaction
package dupetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
)

// ErrInjected is the error of a first attempt the injector failed.
var ErrInjected = errors.New("dupetest: injected failure after the handler ran")

// ErrOutsideTx is the error of a first attempt whose effect, as
// Config.State reads it, survived the rollback of the inbox transaction:
// the handler wrote outside that transaction, so every redelivery after
// a failure repeats the effect.
var ErrOutsideTx = errors.New("dupetest: the handler's effect survived a rollback of the inbox transaction")

// Config configures an Injector.
type Config struct {
	// Seed seeds the decisions. Default: 0 (a fixed seed too: runs repeat).
	Seed uint64
	// Fraction of messages delivered again, in [0, 1]. Default: 0.5. Use
	// 1 to duplicate every message.
	Fraction float64
	// Late is the fraction of the copies delivered late rather than right
	// after the original, at most 1. Default: 0.5. A negative value means
	// none: every copy follows its original at once (for code that cannot
	// call Wait before it shuts down).
	Late float64
	// MaxDelay bounds the delay of a late copy. Default: 50 ms.
	MaxDelay time.Duration
	// FailFirst is the fraction of messages whose first attempt fails with
	// ErrInjected after the handler ran, at most 1. The router nacks it and
	// the broker redelivers. Without Inbox the attempt fails after the
	// whole handler chain returned, as a lost acknowledgement does; with
	// Inbox, inside the inbox, before it commits. Default: 0 (none).
	FailFirst float64
	// Inbox is the transactional inbox under test (inbox.Middleware of
	// middleware.NewInbox). When set, Middleware runs the handler inside
	// it, so add the injector to the router instead of the inbox, not
	// beside it (two inboxes would claim the same key twice). A first
	// attempt picked by FailFirst then fails after the handler returned
	// and before the inbox commits: the inbox rolls back, and the broker
	// redelivers. Default: nil (the injector wraps whatever it is given).
	Inbox message.HandlerMiddleware
	// State reads the effect of one message's handling (a row count or a
	// balance by the message's key), outside any transaction. When set,
	// the injector reads it before each first attempt it fails inside
	// Inbox and again after the inbox rolled back; if the two differ
	// (reflect.DeepEqual), the handler wrote outside the inbox's
	// transaction: the attempt fails with ErrOutsideTx instead of
	// ErrInjected, and the error is kept in Stats.RollbackErrors, with
	// State's own errors. State must read this message's effect only:
	// other messages and late copies run meanwhile. It needs Inbox and a
	// FailFirst above 0, and is for the transactional inbox: a two-phase
	// handler's effects are in no transaction, so every one survives.
	// Default: nil (no check).
	State func(msg *message.Message) (any, error)
}

func (c *Config) setDefaults() {
	if c.Fraction == 0 {
		c.Fraction = 0.5
	}
	if c.Late == 0 {
		c.Late = 0.5
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = 50 * time.Millisecond
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"Fraction", c.Fraction}, {"Late", c.Late}, {"FailFirst", c.FailFirst}} {
		if f.v > 1 {
			errs = append(errs, fmt.Errorf("config.%s must be at most 1, got %v", f.name, f.v))
		}
	}
	if c.Fraction < 0 {
		errs = append(errs, fmt.Errorf("config.Fraction must not be negative, got %v", c.Fraction))
	}
	if c.MaxDelay < 0 {
		errs = append(errs, fmt.Errorf("config.MaxDelay must not be negative, got %s", c.MaxDelay))
	}
	if c.State != nil && c.Inbox == nil {
		errs = append(errs, errors.New("config.State needs config.Inbox: only a failure inside the inbox rolls its transaction back"))
	}
	if c.State != nil && c.FailFirst <= 0 {
		errs = append(errs, fmt.Errorf("config.State is checked on the first attempts FailFirst fails: set config.FailFirst above 0, got %v", c.FailFirst))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid dupetest config: %w", err)
	}
	return nil
}

// Stats counts what an Injector did.
type Stats struct {
	// Messages is the number of first deliveries seen.
	Messages int
	// Immediate and Late count the copies delivered (or scheduled, for
	// late ones not yet delivered) right after the original and late.
	Immediate, Late int
	// FailedFirst counts first attempts failed with ErrInjected.
	FailedFirst int
	// CopyErrors are the errors handlers returned for copies; a copy's
	// output messages are dropped.
	CopyErrors []error
	// RollbackErrors are the findings of Config.State: an ErrOutsideTx
	// for each first attempt whose effect survived the inbox's rollback,
	// and the errors State returned. Empty when State is not set.
	RollbackErrors []error
}

// Injector is a router middleware delivering copies of messages. It is
// safe for concurrent use.
type Injector struct {
	config Config

	mu    sync.Mutex
	rnd   *rand.Rand
	seen  map[string]bool // UUIDs whose first delivery was seen
	stats Stats
	late  sync.WaitGroup
}

// New returns an Injector; it panics on an invalid config (a test
// helper: the mistake is the test's).
func New(config Config) *Injector {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		panic(err)
	}
	return &Injector{
		config: config,
		rnd:    rand.New(rand.NewPCG(config.Seed, 0x6475706574657374)),
		seen:   map[string]bool{},
	}
}

type plan struct {
	first, copy, late, fail bool
	delay                   time.Duration
}

func (i *Injector) decide(uuid string) plan {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.seen[uuid] {
		return plan{} // a redelivery or a copy: deliver as is
	}
	i.seen[uuid] = true
	i.stats.Messages++
	// Always draw the same numbers per message, so one decision does not
	// shift the others.
	d, l, f, delay := i.rnd.Float64(), i.rnd.Float64(), i.rnd.Float64(), i.rnd.Float64()
	p := plan{first: true, copy: d < i.config.Fraction, fail: f < i.config.FailFirst}
	p.late = p.copy && l < i.config.Late
	p.delay = time.Duration(delay * float64(i.config.MaxDelay))
	switch {
	case p.late:
		i.stats.Late++
	case p.copy:
		i.stats.Immediate++
	}
	if p.fail {
		i.stats.FailedFirst++
	}
	return p
}

// Middleware wraps h; add it to a router (first, so that copies pass
// through the other middleware) or call it on a handler directly. With
// Config.Inbox it wraps h in the inbox too.
func (i *Injector) Middleware(h message.HandlerFunc) message.HandlerFunc {
	inbox := i.config.Inbox != nil
	if inbox {
		h = i.config.Inbox(failInside(h))
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		p := i.decide(msg.UUID)
		var dup *message.Message
		if p.copy {
			dup = copyOf(msg) // before h: the handler may change the original
		}
		var out []*message.Message
		var err error
		if p.fail && inbox {
			out, err = i.failInInbox(h, msg)
		} else {
			out, err = h(msg)
		}
		if p.copy && p.late {
			i.late.Add(1)
			time.AfterFunc(p.delay, func() {
				defer i.late.Done()
				i.deliverCopy(h, dup)
			})
		} else if p.copy {
			i.deliverCopy(h, dup)
		}
		if err == nil && p.fail && !inbox {
			return nil, fmt.Errorf("%w (message %s)", ErrInjected, msg.UUID)
		}
		return out, err
	}
}

// attempt is a first attempt to fail inside the inbox: failInside finds
// it in the message's context, which the inbox passes on to the handler.
type attempt struct {
	failed bool   // failInside failed it: the inbox rolled back
	key    string // the inbox's key for the message, if it ran the handler
}

type attemptKey struct{}

// failInside fails the attempt in msg's context, if any, after h returned
// without an error: inside the inbox, before its commit.
func failInside(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		a, _ := msg.Context().Value(attemptKey{}).(*attempt)
		key, _ := idempotency.KeyFromContext(msg.Context())
		out, err := h(msg)
		if a == nil || a.failed || err != nil {
			return out, err
		}
		a.failed, a.key = true, key
		return nil, fmt.Errorf("%w (message %s)", ErrInjected, msg.UUID)
	}
}

// failInInbox runs h, the inbox around failInside, for a first attempt
// to fail, and checks Config.State across the rollback.
func (i *Injector) failInInbox(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	state := i.config.State
	var before any
	if state != nil {
		var err error
		if before, err = state(msg); err != nil {
			i.rollbackError(fmt.Errorf("dupetest: State of message %s before the attempt: %w", msg.UUID, err))
			state = nil
		}
	}
	a := &attempt{}
	original := msg.Context()
	msg.SetContext(context.WithValue(original, attemptKey{}, a))
	out, err := func() ([]*message.Message, error) {
		defer msg.SetContext(original) // a panic too leaves the message as it came
		return h(msg)
	}()
	if !a.failed || state == nil {
		return out, err
	}
	after, serr := state(msg)
	switch {
	case serr != nil:
		i.rollbackError(fmt.Errorf("dupetest: State of message %s after the rollback: %w", msg.UUID, serr))
	case !reflect.DeepEqual(before, after):
		key := ""
		if a.key != "" && a.key != msg.UUID {
			key = fmt.Sprintf(", key %q", a.key)
		}
		err = fmt.Errorf("%w (message %s%s): State was %v before the attempt and %v after the rollback, "+
			"so the handler writes outside the inbox's transaction and every redelivery after a failure repeats its effect; "+
			"write with idempotency.Tx[*sql.Tx](msg.Context()), not with the *sql.DB",
			ErrOutsideTx, msg.UUID, key, before, after)
		i.rollbackError(err)
	}
	return out, err
}

func (i *Injector) rollbackError(err error) {
	i.mu.Lock()
	i.stats.RollbackErrors = append(i.stats.RollbackErrors, err)
	i.mu.Unlock()
}

func (i *Injector) deliverCopy(h message.HandlerFunc, dup *message.Message) {
	if _, err := h(dup); err != nil {
		i.mu.Lock()
		i.stats.CopyErrors = append(i.stats.CopyErrors, fmt.Errorf("copy of message %s: %w", dup.UUID, err))
		i.mu.Unlock()
	}
}

// copyOf is what a broker redelivers: the same UUID, metadata and
// payload, and the original's context values (the handler name, which
// scopes an inbox) without its cancellation.
func copyOf(msg *message.Message) *message.Message {
	dup := msg.Copy()
	dup.SetContext(context.WithoutCancel(msg.Context()))
	return dup
}

// Wait blocks until every late copy scheduled so far has been delivered.
// Call it before asserting a handler's effects.
func (i *Injector) Wait() { i.late.Wait() }

// Stats returns what the injector did so far.
func (i *Injector) Stats() Stats {
	i.mu.Lock()
	defer i.mu.Unlock()
	s := i.stats
	s.CopyErrors = append([]error(nil), s.CopyErrors...)
	s.RollbackErrors = append([]error(nil), s.RollbackErrors...)
	return s
}
