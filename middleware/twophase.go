package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/lease"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/repository"
)

// TwoPhaseConfig configures a TwoPhaseInbox.
type TwoPhaseConfig struct {
	// Repository stores the records. Required.
	Repository repository.TwoPhase
	// Consumer names the service that owns this inbox, exactly as in
	// Config: the scope is Consumer + ScopeSeparator + handler name, or
	// Consumer alone outside a router. Required. At most 255 bytes, valid
	// UTF-8, no NUL byte.
	Consumer string
	// HandlerScopes maps a handler name to an explicit scope, as in
	// Config. Default: nil.
	HandlerScopes map[string]string
	// Key extracts the deduplication key. Default: UUIDKey.
	Key KeyFunc
	// Lease is how long a claim stays exclusive without being extended.
	// Default: idempotency.DefaultLease (30 s). Choose it well above the time one
	// extension takes to reach the store, and below the broker's
	// redelivery delay, so a crashed attempt is detected on redelivery.
	Lease time.Duration
	// ExtendEvery is how often the lease of a running handler is extended.
	// Default: Lease/3. Must be shorter than Lease.
	ExtendEvery time.Duration
	// OnExpiredLease is the policy for an earlier attempt whose lease
	// expired. Default: Intervene.
	OnExpiredLease idempotency.ExpiredLeasePolicy
	// Retention is how long a completed key is remembered. Default:
	// idempotency.DefaultRetention (7 days).
	Retention time.Duration
	// RedeliveryWindow: as in Config; a shorter Retention is refused.
	// Default: DefaultRedeliveryWindow (1 h).
	RedeliveryWindow time.Duration
	// Logger receives the inbox's logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Now returns the current time; leases are compared against it.
	// Default: time.Now.
	Now func() time.Time
	// Observer: as in Config (mode "two-phase"). Default: nil.
	Observer idempotency.Observer
	// MaxResultBytes: as in Config. The check comes after the effect, so a
	// larger result fails the delivery with the permanent
	// idempotency.ErrResultTooLarge and leaves the record in progress (releasing it
	// would invite a second effect): once its lease expires an operator
	// finds it with repository.Operator.ListStuck. Default:
	// DefaultMaxResultBytes (1 MiB).
	MaxResultBytes int
	// StoreTimeout bounds each store call: the claim, every lease
	// extension and every Complete or Release attempt. A hung call is
	// abandoned (its context cancelled) after it, so it can neither hold
	// the delivery nor outlive the handler, and a claim that waited (on a
	// lock, a slow store) comes back while its lease lasts. A delivery
	// waits for the store for at most about 2 × StoreTimeout besides the
	// handler's own time: a Complete or Release not answered by then goes
	// on in the background (see Drain) and the delivery fails, to be
	// redelivered. Default: Lease/3 (the default ExtendEvery; not a
	// shorter ExtendEvery you set, which would leave a slow store no time
	// to answer). Must be shorter than Lease.
	StoreTimeout time.Duration
	// idempotency.FinishRetry bounds how Complete (and Release after a handler error)
	// is retried after a store error. Default: see idempotency.FinishRetry.
	FinishRetry idempotency.FinishRetry
}

func (c *TwoPhaseConfig) setDefaults() {
	if c.Key == nil {
		c.Key = UUIDKey
	}
	lease.Fill(&c.Lease, &c.ExtendEvery, &c.StoreTimeout, (*lease.Retry)(&c.FinishRetry))
	protocol.SetDefaults(&c.Retention, idempotency.DefaultRetention, &c.Logger, &c.Now)
	if c.RedeliveryWindow == 0 {
		c.RedeliveryWindow = DefaultRedeliveryWindow
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = DefaultMaxResultBytes
	}
}

// protocol returns the settings the protocol's two-phase run takes.
func (c TwoPhaseConfig) protocol() protocol.TwoPhaseConfig {
	return protocol.TwoPhaseConfig{
		Repo: c.Repository, Policy: c.OnExpiredLease, Retention: c.Retention, RedeliveryWindow: c.RedeliveryWindow,
		Lease: lease.Settings{Lease: c.Lease, ExtendEvery: c.ExtendEvery, StoreTimeout: c.StoreTimeout, Retry: lease.Retry(c.FinishRetry)},
		Now:   c.Now, Logger: c.Logger,
	}
}

// Validate reports every problem with the configuration at once.
func (c TwoPhaseConfig) Validate() error {
	errs := c.protocol().Validate("TwoPhaseConfig")
	errs = append(errs, validateScoping("TwoPhaseConfig", c.Consumer, c.HandlerScopes, true)...)
	return settings.Invalid("two-phase inbox", errs)
}

// TwoPhaseInbox is the inbox for effects that cannot join a SQL
// transaction — a payment API, an e-mail, a write to another store. It
// claims the key in progress under a lease, runs the handler, then marks
// the key completed with the handler's output:
//
//   - completed key, same payload: acknowledged without running the
//     handler, output replayed with its original UUIDs;
//   - completed key, other payload: idempotency.ErrPayloadMismatch (permanent);
//   - in progress under a live lease (another consumer is on it):
//     idempotency.ErrInProgress, transient — the broker redelivers later;
//   - in progress under an expired lease: OnExpiredLease decides —
//     Reclaim (exactly one racing delivery takes over and re-runs) or
//     Intervene (idempotency.ErrNeedsIntervention, permanent, record kept);
//   - handler error or panic: the claim is released so a retry can run.
//
// While the handler runs, its lease is extended every ExtendEvery, each
// extension bounded by StoreTimeout; when the handler returns, an
// extension in flight is abandoned and no new one starts. If an extension
// finds the lease taken over by a newer owner, the handler's context
// (msg.Context()) is cancelled, and its completion is refused with
// repository.ErrLeaseLost: an attempt that outlived its lease can never
// overwrite the newer owner's record. Complete (and Release after a
// handler error) is retried after a store error as idempotency.FinishRetry allows,
// extending the lease in between, so a transient store error after the
// effect neither re-runs it nor poisons an applied message. The handler's effect is not
// rolled back by anything — that is why the key is available through
// idempotency.KeyFromContext, to make the effect itself idempotent downstream.
type TwoPhaseInbox struct {
	config TwoPhaseConfig
	scope  scoping
	obs    observability
	proto  *protocol.TwoPhase
}

// NewTwoPhaseInbox validates config and returns a TwoPhaseInbox.
func NewTwoPhaseInbox(config TwoPhaseConfig) (*TwoPhaseInbox, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &TwoPhaseInbox{
		config: config,
		scope:  newScoping(config.Consumer, config.HandlerScopes),
		obs:    newObservability(idempotency.ModeTwoPhase, config.Logger, config.Observer),
		proto:  protocol.NewTwoPhase(config.protocol(), "Inbox", "inbox"),
	}, nil
}

// Drain waits until the store writes that earlier deliveries left
// running in the background have ended, or ctx ends (its error then). A
// delivery waits for the store for at most about 2 × StoreTimeout
// besides the handler's own time; a Complete or Release the store has
// not answered by then goes on in the background, retried as
// idempotency.FinishRetry allows, and the delivery fails (the broker redelivers; the
// copy finds the key in progress, then completed). Call Drain after the
// router has stopped, before the process exits.
func (i *TwoPhaseInbox) Drain(ctx context.Context) error { return i.proto.Leases.Drain(ctx) }

// Middleware wraps h; add it to a router or a single handler.
func (i *TwoPhaseInbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return i.handle(h, msg)
	}
}

func (i *TwoPhaseInbox) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	obs, ctx, scope, key, err := beginDelivery(i.obs, i.scope, i.config.Key, msg)
	if err != nil {
		return nil, err
	}
	owner := watermill.NewUUID()
	obs.setField("owner", owner)
	var r ran
	a := i.proto.Do(ctx, protocol.Call{
		Scope: scope, Key: key, Owner: owner, Hash: repository.HashPayload(msg.Payload), Fields: obs.fields,
		Run: func(ctx context.Context) error {
			original := msg.Context()
			defer msg.SetContext(original)
			msg.SetContext(withScope(withKey(ctx, key), scope))
			out, err := h(msg)
			if r.stale = errors.Is(err, ErrStaleVersion); err != nil && !r.stale {
				return err
			}
			r.out, r.produced = out, len(out)
			return nil
		},
		Result: func() ([]byte, error) {
			i.obs.inject(ctx, r.out)
			return encodeResult(r.out, i.config.MaxResultBytes)
		},
	})
	obs.d.Claim = a.Claim
	out, err := answer(ctx, obs, a, r, nil)
	if a.Panic != nil {
		panic(a.Panic) // for Recoverer or the process, as without the inbox
	}
	return out, err
}
