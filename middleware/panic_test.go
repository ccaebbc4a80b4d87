package middleware_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/backends"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/memory"
)

// panicking is a handler that panics while fail is set, and otherwise
// returns one message.
type panicking struct {
	mu   sync.Mutex
	fail bool
	runs int
}

func (p *panicking) handle(msg *message.Message) ([]*message.Message, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs++
	if p.fail {
		panic("handler bug " + msg.UUID)
	}
	return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, nil
}

func (p *panicking) set(fail bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail = fail
}

// entryPoint is one of the middleware's inboxes, built with an observer.
type entryPoint struct {
	name string
	// wrap returns the entry point's middleware around h, reporting to
	// obs.
	wrap func(t *testing.T, obs idempotency.Observer, h message.HandlerFunc) message.HandlerFunc
	// remembers reports whether the entry point remembers a processed
	// message, so that a copy is answered without the handler.
	remembers bool
}

// entryPoints are every inbox of the middleware, on SQLite (the
// transactional ones) and memory (two-phase).
func entryPoints(t *testing.T) []entryPoint {
	return []entryPoint{
		{name: "transactional", remembers: true, wrap: func(t *testing.T, obs idempotency.Observer, h message.HandlerFunc) message.HandlerFunc {
			return newSQLiteStore(t).newInbox(t, "shop", func(c *middleware.Config) { c.Observer = obs }).Middleware(h)
		}},
		{name: "group commit, fixed limit 4", remembers: true, wrap: func(t *testing.T, obs idempotency.Observer, h message.HandlerFunc) message.HandlerFunc {
			return newSQLiteStore(t).newInbox(t, "shop", func(c *middleware.Config) {
				c.Observer = obs
				c.Batch = middleware.BatchConfig{MaxMessages: 4, MaxWait: time.Millisecond, Fixed: true}
			}).Middleware(h)
		}},
		{name: "group commit, adaptive", remembers: true, wrap: func(t *testing.T, obs idempotency.Observer, h message.HandlerFunc) message.HandlerFunc {
			return newSQLiteStore(t).newInbox(t, "shop", func(c *middleware.Config) {
				c.Observer = obs
				c.Batch = middleware.BatchConfig{MaxMessages: 4, MaxWait: time.Millisecond}
			}).Middleware(h)
		}},
		{name: "two-phase", remembers: true, wrap: func(t *testing.T, obs idempotency.Observer, h message.HandlerFunc) message.HandlerFunc {
			return newTwoPhase(t, memory.NewRepository(), func(c *middleware.TwoPhaseConfig) { c.Observer = obs }).Middleware(h)
		}},
		{name: "natural key", wrap: func(t *testing.T, obs idempotency.Observer, h message.HandlerFunc) message.HandlerFunc {
			return middleware.NewNaturalKey(middleware.NaturalKeyConfig{Consumer: "shop", Observer: obs}).Middleware(h)
		}},
	}
}

// TestHandlerPanicIsObservedAndRaised: on every entry point, a handler's
// panic ends the delivery for the observer (failed, with the panic in its
// error), leaves nothing committed, and is raised again on the
// delivery's own goroutine for Recoverer — whatever group commit's
// limit. The redelivery then runs the handler.
func TestHandlerPanicIsObservedAndRaised(t *testing.T) {
	for _, ep := range entryPoints(t) {
		t.Run(ep.name, func(t *testing.T) {
			t.Parallel()
			obs := &backends.Lifecycle{}
			h := &panicking{fail: true}
			mw := ep.wrap(t, obs, h.handle)

			// Four at once: under group commit they share batches, at
			// whatever limit the adaptation is.
			msgs := make([]*message.Message, 4)
			for k := range msgs {
				msgs[k] = message.NewMessage(fmt.Sprintf("m-%d", k), []byte("payload"))
			}
			_, errs := deliverConcurrently(mw, msgs)
			for k, err := range errs {
				require.Equal(t, "handler bug m-"+fmt.Sprint(k), panicOf(err), "delivery %d raises the handler's panic", k)
			}
			require.Equal(t, 4, obs.Started())
			all := obs.All()
			require.Len(t, all, 4, "every started delivery ended")
			for _, d := range all {
				require.Equal(t, idempotency.OutcomeFailed, d.Outcome)
				require.ErrorContains(t, d.Err, "handler panicked: handler bug")
			}

			// Nothing stayed: the redelivery runs the handler.
			h.set(false)
			for _, m := range msgs {
				out, err := deliverRecovered(mw, m.Copy())
				require.NoError(t, err)
				require.Len(t, out, 1)
			}
			require.Equal(t, 8, h.runs)
		})
	}
}

// TestObserverPanicChangesNothing: an Observer that panics in
// StartDelivery or ObserveDelivery does not fail, redeliver or panic the
// delivery it reports; the panic is logged. A copy of the processed
// message is then acknowledged as a duplicate, also while the observer
// keeps panicking.
func TestObserverPanicChangesNothing(t *testing.T) {
	for _, ep := range entryPoints(t) {
		for _, where := range []string{"start", "observe"} {
			t.Run(ep.name+"/"+where, func(t *testing.T) {
				t.Parallel()
				obs := &backends.Lifecycle{PanicOnStart: where == "start", PanicOnObserve: where == "observe"}
				h := &panicking{}
				mw := ep.wrap(t, obs, h.handle)

				msg := message.NewMessage("m-1", []byte("payload"))
				out, err := deliverRecovered(mw, msg)
				require.NoError(t, err, "the observer's panic is not the delivery's")
				require.Len(t, out, 1)
				out, err = deliverRecovered(mw, msg.Copy())
				require.NoError(t, err)
				if ep.remembers {
					require.Len(t, out, 1, "replayed")
					require.Equal(t, 1, h.runs, "the copy is a duplicate")
				}
				require.Equal(t, 2, obs.Started())
				require.Len(t, obs.All(), 2)
			})
		}
	}
}

// TestObserverPanicIsLogged: the panic an observer raises is logged at
// error level with the delivery's key and outcome.
func TestObserverPanicIsLogged(t *testing.T) {
	logs := watermill.NewCaptureLogger()
	obs := &backends.Lifecycle{PanicOnObserve: true}
	mw := newSQLiteStore(t).newInbox(t, "shop", func(c *middleware.Config) {
		c.Observer, c.Logger = obs, logs
	}).Middleware((&panicking{}).handle)
	_, err := mw(message.NewMessage("m-1", nil))
	require.NoError(t, err)
	var found bool
	for _, l := range logs.Captured()[watermill.ErrorLogLevel] {
		if l.Msg == "Observer panicked reporting an outcome; the outcome stands" {
			found = true
			require.ErrorContains(t, l.Err, "observer panics in ObserveDelivery")
			require.Equal(t, "m-1", l.Fields["key"])
		}
	}
	require.True(t, found, "the observer's panic is logged")
}
