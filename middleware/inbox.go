package middleware

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/ctxkeys"
	"github.com/idemkit/watermill-idempotent/internal/protocol"
	"github.com/idemkit/watermill-idempotent/repository"
)

// DefaultRedeliveryWindow is the redelivery window assumed when none is
// declared (Config.RedeliveryWindow, TwoPhaseConfig.RedeliveryWindow): a
// broker redelivers an unacknowledged message and a producer retries a
// send within it, so a shorter Retention is refused as a mistake.
const DefaultRedeliveryWindow = time.Hour

// Config configures an Inbox.
type Config struct {
	// Consumer names the service that owns this inbox ("payments"). It is
	// required: records are stored per (scope, key), and each delivery's
	// scope is Consumer + ScopeSeparator + the name of the Watermill
	// handler that runs it (message.HandlerNameFromCtx): "payments/billing".
	// So neither two handlers of one router sharing a topic, even with the
	// inbox added to the whole router, nor two services sharing the table
	// and a handler name ever suppress each other's messages. A delivery
	// without a handler name (the middleware called outside a router) uses
	// Consumer alone. Give every service its own Consumer: two services
	// with the same one and a handler of the same name consuming one topic
	// acknowledge each other's messages as duplicates.
	//
	// A derived scope longer than 255 bytes, not valid UTF-8 or holding a
	// NUL byte fails each delivery with the permanent idempotency.ErrInvalidScope.
	// Scopes must stay stable across deployments: renaming a handler (or
	// changing Consumer) forgets its processed keys, so copies of messages
	// it already handled are processed once more until their retention
	// would have ended. Keep them with HandlerScopes. At most 255 bytes,
	// valid UTF-8, no NUL byte.
	Consumer string
	// HandlerScopes maps a Watermill handler name to the scope its
	// deliveries use, overriding the rule above. Use it to keep a handler's
	// remembered keys across a rename ({"charge-card": "payments/billing"}
	// after renaming handler "billing" to "charge-card" under Consumer
	// "payments"), to keep keys stored by an earlier version: under the
	// bare handler name ({"billing": "billing"}: before Consumer was
	// required, an inbox without one scoped by handler name alone) or
	// under its Consumer alone ({"billing": "shop"}: before scopes were
	// per handler); or to make handlers share one scope on purpose
	// (competing handlers of one service). Entries are used as they are,
	// without Consumer, so a mapped scope is shared by every service that
	// maps to it: once Retention has passed since the upgrade, the old
	// keys have expired and the mapping can go. Default: nil. Each scope
	// at most 255 bytes, valid UTF-8, no NUL byte.
	HandlerScopes map[string]string
	// Key extracts the deduplication key. Default: UUIDKey.
	Key KeyFunc
	// Retention is how long a processed key is remembered. Default:
	// idempotency.DefaultRetention (7 days).
	Retention time.Duration
	// RedeliveryWindow is the longest time after which the broker or the
	// producer may still deliver a copy of a message. A Retention shorter
	// than it is refused: duplicates arriving after the marker expired
	// would be processed again. Default: DefaultRedeliveryWindow (1 h),
	// so a Retention of seconds is refused unless the window is declared
	// that short.
	RedeliveryWindow time.Duration
	// Logger receives the inbox's logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
	// Observer, if set, is told of every delivery: metrics.Metrics
	// counts them, tracing.New(tp) gives each a span (see Observer and
	// idempotency.DeliveryStarter; Observers combines several). Default: nil (no
	// reports, no spans).
	Observer idempotency.Observer
	// Outputs, if set, receives the messages the handler returns, inside
	// the inbox transaction — typically a transactional outbox (see
	// outbox.Outbox.Outputs) — instead of the router publishing them after
	// the commit. Each output first gets the deterministic UUID
	// OutputUUID(Consumer, key, position), so a re-run writes the same
	// UUIDs. The middleware then returns no messages to the router, and
	// duplicates replay nothing: the outputs committed with the marker.
	// Default: nil (outputs go back to the router and are stored for
	// replay).
	Outputs OutputWriter
	// ReadFirst looks the key up before opening a transaction, so that a
	// duplicate costs one read instead of a transaction (BEGIN, claim,
	// read, ROLLBACK). Every first delivery pays that read on top of its
	// transaction, so turn it on for streams that carry many duplicates
	// (a replay after an outage, a producer that retries a lot). The claim
	// in the transaction still decides every race; the read only answers
	// keys already completed. Default: false (but see
	// ReadFirstAbove: the inbox reads first by itself while duplicates are
	// frequent).
	ReadFirst bool
	// ReadFirstAbove turns ReadFirst on by itself, per scope, while the
	// share of duplicates among the scope's recent deliveries (a moving
	// average over about the last 32) is at least this fraction, and off
	// again when it falls below: a stream of first deliveries pays nothing
	// for it, and a replay of copies is answered with one read each.
	// Default: DefaultReadFirstAbove (0.25, where one read
	// saved per duplicate outweighs one read added per first delivery).
	// Negative or above 1: never (only ReadFirst).
	ReadFirstAbove float64
	// MaxResultBytes is the largest encoded result (the messages the
	// handler returns, kept for replay) the inbox stores. A larger one
	// fails the delivery with the permanent idempotency.ErrResultTooLarge before the
	// result is sent to the database, and the transaction (with the
	// handler's writes) rolls back. Negative: no limit. Default: DefaultMaxResultBytes (1 MiB; see it for why).
	MaxResultBytes int
	// Batch turns on group commit: deliveries that arrive concurrently
	// share one transaction, one multi-row claim and one commit, and each
	// is acknowledged only after that commit. Handlers in a batch run in
	// turn on the shared transaction and see each other's writes; a
	// failing handler's delivery fails alone (the others run again
	// without it). ReadFirst is not used in batch mode (a duplicate
	// costs one read inside the batch). The batch's keys are claimed
	// with one multi-row claim. See BatchConfig and docs/batching.md.
	// Default: zero (off).
	Batch BatchConfig
}

// DefaultReadFirstAbove is the default Config.ReadFirstAbove: a
// duplicate answered in its transaction costs about three more round
// trips than one answered by a read, and a first delivery one more with
// the read, so reading first pays from about one duplicate in four.
const DefaultReadFirstAbove = 0.25

// OutputWriter stores a handler's output messages inside the inbox
// transaction, so they are published if and only if it commits: ctx
// carries that transaction (idempotency.Tx), as it does for the handler.
// outbox.Outbox.Outputs returns one.
type OutputWriter interface {
	WriteOutputs(ctx context.Context, msgs []*message.Message) error
}

// beginner begins the inbox's transactions on its repository.Driver,
// whose transaction type it hides (driverBeginner).
type beginner interface {
	// beginClaim begins a transaction and claims params in it (see
	// repository.Driver's BeginClaim); on an error it has ended.
	beginClaim(ctx context.Context, params []repository.ClaimParams) (inboxTx, []repository.Claim, error)
	// reserve takes a connection of the pool for a group commit's batch:
	// a beginner on it, and release.
	reserve(ctx context.Context) (beginner, func(), error)
	retryable(err error) bool
}

// inboxTx is one inbox transaction.
type inboxTx interface {
	protocol.Tx
	// withTx returns ctx carrying the transaction for the handler
	// (idempotency.Tx).
	withTx(ctx context.Context) context.Context
}

// driverBeginner is a beginner on a driver with transactions of type TTx.
type driverBeginner[TTx any] struct{ d repository.Driver[TTx] }

func (b driverBeginner[TTx]) beginClaim(ctx context.Context, params []repository.ClaimParams) (inboxTx, []repository.Claim, error) {
	tx, claims, err := b.d.BeginClaim(ctx, params)
	if err != nil {
		return nil, nil, err
	}
	return driverTx[TTx]{protocol.DriverTx[TTx]{D: b.d, Tx: tx}}, claims, nil
}

func (b driverBeginner[TTx]) reserve(ctx context.Context) (beginner, func(), error) {
	d, release, err := b.d.Reserve(ctx)
	if err != nil {
		return nil, nil, err
	}
	return driverBeginner[TTx]{d}, release, nil
}

func (b driverBeginner[TTx]) retryable(err error) bool { return b.d.Retryable(err) }

// driverTx is an inbox transaction of type TTx.
type driverTx[TTx any] struct{ protocol.DriverTx[TTx] }

func (t driverTx[TTx]) withTx(ctx context.Context) context.Context {
	return ctxkeys.WithTx(ctx, t.Tx)
}

func (c *Config) setDefaults() {
	if c.Key == nil {
		c.Key = UUIDKey
	}
	protocol.SetDefaults(&c.Retention, idempotency.DefaultRetention, &c.Logger, &c.Now)
	if c.RedeliveryWindow == 0 {
		c.RedeliveryWindow = DefaultRedeliveryWindow
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = DefaultMaxResultBytes
	}
	c.Batch.setDefaults()
	if c.ReadFirstAbove == 0 {
		c.ReadFirstAbove = DefaultReadFirstAbove
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, validateScoping("Config", c.Consumer, c.HandlerScopes, true)...)
	errs = append(errs, protocol.ValidateRetention(c.Retention, c.RedeliveryWindow)...)
	errs = append(errs, c.Batch.validate()...)
	return settings.Invalid("inbox", errs)
}

// Inbox is a router middleware that makes a handler's effects happen once
// per (scope, key), however often the broker delivers the message. The
// scope is the service's and the handler's (see Config.Consumer), so one
// Inbox can be added to a whole router and services can share a table.
//
// For each delivery it begins a transaction, claims the key with one
// atomic conditional insert and, on a fresh claim, runs the handler with
// the transaction in msg.Context() (see idempotency.Tx); it stores the
// messages the handler returns with the marker and commits. The marker,
// the handler's writes through the transaction and the stored result
// commit together or not at all:
//
//   - handler error, panic or failed commit: everything rolls back and the
//     error is returned, so the broker redelivers and the retry runs again;
//   - duplicate with the same payload: the handler does not run, the
//     delivery is acknowledged and the stored messages are returned again
//     with their original UUIDs (replay), so a crash between commit and
//     publish loses nothing and downstream inboxes dedupe the repeat;
//   - duplicate with another payload: idempotency.ErrPayloadMismatch (permanent);
//   - no key: idempotency.ErrNoKey (permanent);
//   - a handler name giving an invalid scope: idempotency.ErrInvalidScope (permanent).
//
// A concurrent delivery of the same key waits on the database until the
// first transaction ends. Inbox is safe for concurrent use.
type Inbox struct {
	config   Config
	scope    scoping
	obs      observability
	beginner beginner
	batch    *batcher // nil unless Config.Batch is on
	reader   repository.Reader
	dups     duplicateRates
	tx       protocol.Transactional[inboxTx]
}

// NewInbox validates config and returns an Inbox whose transactions run
// on d: a SQL backend's repository (postgres.NewRepository or
// NewPgxRepository, mysql.NewRepository, sqlite.NewRepository), whose
// table and the handler's business tables live in one database. The
// handler reads the transaction with idempotency.Tx[TTx], TTx being d's
// transaction type (*sql.Tx, pgx.Tx).
func NewInbox[TTx any](d repository.Driver[TTx], config Config) (*Inbox, error) {
	config.setDefaults()
	err := config.Validate()
	if d == nil {
		err = errors.Join(errors.New("inbox: NewInbox needs a repository.Driver (postgres.NewRepository, mysql.NewRepository, sqlite.NewRepository)"), err)
	}
	if err != nil {
		return nil, err
	}
	above := config.ReadFirstAbove
	if config.ReadFirst {
		above = -1 // it is always on: keep no rates
	}
	i := &Inbox{
		config: config,
		scope:  newScoping(config.Consumer, config.HandlerScopes),
		obs:    newObservability(idempotency.ModeTransactional, config.Logger, config.Observer),
		reader: d,
		dups:   duplicateRates{above: above},
	}
	i.beginner = driverBeginner[TTx]{d}
	i.tx = protocol.Transactional[inboxTx]{Prefix: "inbox", BeginClaim: i.beginClaim}
	if config.Batch.MaxMessages > 1 {
		i.batch = &batcher{inbox: i, max: config.Batch.MaxMessages, wait: config.Batch.MaxWait, fixed: config.Batch.Fixed}
	}
	return i, nil
}

// Middleware wraps h; add it to a router or a single handler.
func (i *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	if i.batch != nil {
		return func(msg *message.Message) ([]*message.Message, error) {
			return i.handleBatched(h, msg)
		}
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		return i.handle(h, msg)
	}
}

func (i *Inbox) handle(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	c := i.config
	obs, ctx, scope, key, err := beginDelivery(i.obs, i.scope, c.Key, msg)
	if err != nil {
		return nil, err
	}

	now := c.Now()
	hash := repository.HashPayload(msg.Payload)

	rate := i.dups.of(scope)
	if c.ReadFirst || rate.high() {
		claimStart := time.Now()
		rec, err := i.reader.Get(ctx, scope, key)
		obs.d.Claim = time.Since(claimStart)
		switch {
		case err == nil && rec.State == repository.StateCompleted:
			rate.observe(true)
			return answer(ctx, obs, protocol.Duplicate(scope, key, hash, rec), ran{}, nil)
		case err != nil && !errors.Is(err, repository.ErrNotFound):
			return nil, obs.end(ctx, idempotency.OutcomeFailed, fmt.Errorf("inbox: read key %q: %w", key, err), nil)
		}
		// Not there (or not completed): the transaction's claim decides.
	}

	var r ran
	a := i.tx.Run(ctx, repository.ClaimParams{
		Consumer:    scope,
		Key:         key,
		PayloadHash: hash,
		Now:         now,
		ExpiresAt:   now.Add(c.Retention),
	}, func(ctx context.Context, tx inboxTx) (result []byte, err error) {
		r, result, err = i.runHandler(ctx, tx, h, msg, scope, key)
		return result, err
	})
	obs.d.Claim += a.Claim
	if a.Kind != protocol.Unclaimed {
		rate.observe(a.Kind != protocol.Ran)
	}
	out, err := answer(ctx, obs, a, r, nil)
	if a.Panic != nil {
		panic(a.Panic) // rolled back and reported: now for Recoverer or the process, as without the inbox
	}
	return out, err
}

// ran is what a handler that ran left: the messages for the router to
// publish, how many it returned, and whether it returned ErrStaleVersion
// (then the marker is stored all the same).
type ran struct {
	out      []*message.Message
	produced int
	stale    bool
}

// runHandler runs h for msg on tx, in ctx with the delivery's scope and
// key, and writes its output to Config.Outputs (outputs). It returns
// what the handler left and the result to store with the marker. On an
// error nothing is to be committed.
func (i *Inbox) runHandler(ctx context.Context, tx inboxTx, h message.HandlerFunc, msg *message.Message, scope, key string) (r ran, result []byte, err error) {
	original := msg.Context()
	msg.SetContext(withScope(withKey(tx.withTx(withInboxTx(ctx)), key), scope))
	out, err := func() ([]*message.Message, error) {
		defer msg.SetContext(original) // a panic too leaves the message as it came
		return h(msg)
	}()
	r.stale = errors.Is(err, ErrStaleVersion)
	if err != nil && !r.stale {
		return ran{}, nil, err
	}
	i.obs.inject(ctx, out)
	// The handler's work is done: finish the bookkeeping even if the
	// delivery is being cancelled, rather than throw that work away.
	r.produced = len(out)
	r.out, result, err = i.outputs(context.WithoutCancel(ctx), tx, scope, key, out)
	if err != nil {
		return ran{}, nil, err
	}
	return r, result, nil
}

// outputs writes a handler's output messages in tx through
// Config.Outputs when it is set (the relay publishes them, so nothing is
// left to return or replay), and encodes the result to store for replay.
// It returns the messages for the router to publish now.
func (i *Inbox) outputs(ctx context.Context, tx inboxTx, scope, key string, out []*message.Message) (_ []*message.Message, result []byte, _ error) {
	c := i.config
	if c.Outputs != nil && len(out) > 0 {
		for pos, m := range out {
			m.UUID = OutputUUID(scope, key, pos)
		}
		if err := c.Outputs.WriteOutputs(tx.withTx(ctx), out); err != nil {
			return nil, nil, fmt.Errorf("inbox: write %d outputs of key %q: %w", len(out), key, err)
		}
		// They commit with the marker and the relay publishes them: nothing
		// for the router to publish, nothing to replay.
		out = nil
	}
	result, err := encodeResult(out, c.MaxResultBytes)
	if err != nil {
		return nil, nil, fmt.Errorf("inbox: key %q: %w", key, err)
	}
	return out, result, nil
}

// beginClaim begins an inbox transaction and claims p in it.
func (i *Inbox) beginClaim(ctx context.Context, p repository.ClaimParams) (inboxTx, repository.Claim, error) {
	tx, claims, err := i.beginner.beginClaim(ctx, []repository.ClaimParams{p})
	if err != nil {
		return nil, repository.Claim{}, err
	}
	return tx, claims[0], nil
}

// beginDelivery starts observing msg and resolves its scope and key. A
// delivery without either has ended (observed, logged) when err is
// returned: the handler returns err as it is.
func beginDelivery(o observability, s scoping, keyFunc KeyFunc, msg *message.Message) (_ *observation, _ context.Context, scope, key string, err error) {
	scope, err = s.resolve(msg.Context())
	if err != nil {
		obs, ctx := o.begin(msg, s.fallback())
		return nil, nil, "", "", obs.end(ctx, idempotency.OutcomeNoScope, err, watermill.LogFields{"handler": message.HandlerNameFromCtx(msg.Context())})
	}
	obs, ctx := o.begin(msg, scope)
	key, err = extractKey(keyFunc, scope, msg)
	if err != nil {
		return nil, nil, "", "", obs.end(ctx, idempotency.OutcomeNoKey, err, nil)
	}
	obs.setKey(key)
	return obs, ctx, scope, key, nil
}

// extractKey runs the key function; no key is idempotency.ErrNoKey.
func extractKey(keyFunc KeyFunc, scope string, msg *message.Message) (string, error) {
	key, err := keyFunc(msg)
	if err == nil && key == "" {
		err = errors.New("key function returned an empty key")
	}
	if err != nil {
		return "", fmt.Errorf("%w: scope %q, message %s: %w", idempotency.ErrNoKey, scope, msg.UUID, err)
	}
	return key, nil
}

// answer ends the delivery with the protocol's answer a, and returns
// what the handler returns to the router: r's messages when the handler
// ran, the stored ones when a duplicate is replayed. extra are log
// fields of the outcome.
func answer(ctx context.Context, obs *observation, a protocol.Answer, r ran, extra watermill.LogFields) ([]*message.Message, error) {
	switch a.Kind {
	case protocol.Ran:
		switch {
		case a.Err != nil:
			return nil, obs.end(ctx, idempotency.OutcomeFailed, a.Err, extra)
		case r.stale:
			// The marker is stored too, so copies of the stale message are
			// duplicates from now on.
			return r.out, obs.end(ctx, idempotency.OutcomeStaleVersion, nil, extra)
		}
		return r.out, obs.end(ctx, idempotency.OutcomeProcessed, nil, extra.Add(watermill.LogFields{"produced": r.produced}))
	case protocol.Replay:
		out, err := DecodeResult(a.Record.Result)
		if err != nil {
			return nil, obs.end(ctx, idempotency.OutcomeFailed, fmt.Errorf("inbox: replay key %q: %w", obs.d.Key, err), nil)
		}
		if len(out) == 0 {
			return nil, obs.end(ctx, idempotency.OutcomeDuplicate, nil, nil)
		}
		obs.d.Replayed = len(out)
		return out, obs.end(ctx, idempotency.OutcomeReplayed, nil, watermill.LogFields{"replayed": len(out)})
	case protocol.Busy:
		return nil, obs.end(ctx, idempotency.OutcomeLeaseBusy, a.Err, watermill.LogFields{"lease_owner": a.Record.LeaseOwner})
	}
	return nil, obs.end(ctx, idempotency.Outcome(a.Outcome()), a.Err, nil)
}
