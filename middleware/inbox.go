package middleware

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idemkit/watermill-idempotent/repository"
)

// DefaultRetention is how long a processed key is remembered by default.
const DefaultRetention = 7 * 24 * time.Hour

// Config configures an Inbox.
type Config struct {
	// DB is the database the inbox transaction runs on; the repository's
	// table and the handler's business tables must live in it. Required.
	DB *sql.DB
	// Repository stores the markers. Required.
	Repository repository.Transactional
	// Consumer names this consumer (usually the handler). Keys are scoped
	// by it, so several handlers of one topic sharing a table never
	// suppress each other. Required; at most 255 bytes. Keep it stable
	// across deployments: renaming it forgets every processed key.
	Consumer string
	// Key extracts the deduplication key. Default: UUIDKey.
	Key KeyFunc
	// Retention is how long a processed key is remembered. Default:
	// DefaultRetention (7 days).
	Retention time.Duration
	// RedeliveryWindow is the longest time after which the broker or the
	// producer may still deliver a copy of a message. A Retention shorter
	// than it is refused: duplicates arriving after the marker expired
	// would be processed again. Default: 0 (not declared; not checked).
	RedeliveryWindow time.Duration
	// TxOptions are used to begin the inbox transaction. Default: nil (the
	// driver's default isolation level).
	TxOptions *sql.TxOptions
	// Logger receives the inbox's logs. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Now returns the current time. Default: time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Key == nil {
		c.Key = UUIDKey
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.DB == nil {
		errs = append(errs, errors.New("missing Config.DB"))
	}
	if c.Repository == nil {
		errs = append(errs, errors.New("missing Config.Repository"))
	}
	if c.Consumer == "" {
		errs = append(errs, errors.New("missing Config.Consumer"))
	} else if len(c.Consumer) > repository.MaxConsumerLength {
		errs = append(errs, fmt.Errorf("config.Consumer must be at most %d bytes", repository.MaxConsumerLength))
	}
	if c.Retention <= 0 {
		errs = append(errs, fmt.Errorf("config.Retention must be positive, got %s", c.Retention))
	}
	if c.RedeliveryWindow < 0 {
		errs = append(errs, fmt.Errorf("config.RedeliveryWindow must not be negative, got %s", c.RedeliveryWindow))
	}
	if c.Retention < c.RedeliveryWindow {
		errs = append(errs, fmt.Errorf("config.Retention (%s) is shorter than RedeliveryWindow (%s): duplicates arriving after the marker expired would be processed again", c.Retention, c.RedeliveryWindow))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid inbox config: %w", err)
	}
	return nil
}

// Inbox is a router middleware that makes a handler's effects happen once
// per (consumer, key), however often the broker delivers the message.
//
// For each delivery it begins a transaction, claims the key with one
// atomic conditional insert and, on a fresh claim, runs the handler with
// the transaction in msg.Context() (see TxFromContext); it stores the
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
//   - duplicate with another payload: ErrPayloadMismatch (permanent);
//   - no key: ErrNoKey (permanent).
//
// A concurrent delivery of the same key waits on the database until the
// first transaction ends. Inbox is safe for concurrent use.
type Inbox struct {
	config Config
}

// NewInbox validates config and returns an Inbox.
func NewInbox(config Config) (*Inbox, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Inbox{config: config}, nil
}

// Middleware wraps h; add it to a router or a single handler.
func (i *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return i.handle(h, msg)
	}
}

func (i *Inbox) handle(h message.HandlerFunc, msg *message.Message) (_ []*message.Message, err error) {
	c := i.config
	fields := watermill.LogFields{
		"consumer":       c.Consumer,
		"message_uuid":   msg.UUID,
		"correlation_id": wmiddleware.MessageCorrelationID(msg),
	}

	key, keyErr := c.Key(msg)
	if keyErr != nil || key == "" {
		if keyErr == nil {
			keyErr = errors.New("key function returned an empty key")
		}
		err := fmt.Errorf("%w: consumer %q, message %s: %w", ErrNoKey, c.Consumer, msg.UUID, keyErr)
		c.Logger.Error("Inbox: message has no deduplication key", err, fields)
		return nil, err
	}
	fields["key"] = key

	ctx := msg.Context()
	now := c.Now()
	hash := repository.HashPayload(msg.Payload)

	tx, err := c.DB.BeginTx(ctx, c.TxOptions)
	if err != nil {
		return nil, fmt.Errorf("inbox: begin transaction: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			// Covers errors and panics alike: nothing of this attempt stays.
			_ = tx.Rollback()
		}
	}()

	claim, err := c.Repository.ClaimTx(ctx, tx, repository.ClaimParams{
		Consumer:    c.Consumer,
		Key:         key,
		PayloadHash: hash,
		Now:         now,
		ExpiresAt:   now.Add(c.Retention),
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: claim key %q: %w", key, err)
	}
	if !claim.Claimed {
		return i.duplicate(claim.Existing, hash, key, fields)
	}

	original := ctx
	msg.SetContext(withKey(withTx(ctx, tx), key))
	out, err := h(msg)
	msg.SetContext(original)
	if err != nil {
		c.Logger.Debug("Inbox: handler failed, rolled back", fields.Add(watermill.LogFields{"err": err}))
		return nil, err
	}

	result, err := encodeResult(out)
	if err != nil {
		return nil, fmt.Errorf("inbox: %w", err)
	}
	if result != nil {
		if err := c.Repository.SaveResultTx(ctx, tx, repository.SaveResultParams{Consumer: c.Consumer, Key: key, Result: result}); err != nil {
			return nil, fmt.Errorf("inbox: store result of key %q: %w", key, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("inbox: commit key %q: %w", key, err)
	}
	committed = true
	c.Logger.Debug("Inbox: processed", fields.Add(watermill.LogFields{"produced": len(out)}))
	return out, nil
}

func (i *Inbox) duplicate(rec repository.Record, hash []byte, key string, fields watermill.LogFields) ([]*message.Message, error) {
	c := i.config
	if !bytes.Equal(rec.PayloadHash, hash) {
		err := fmt.Errorf("%w: consumer %q, key %q (first processed at %s)", ErrPayloadMismatch, c.Consumer, key, rec.CreatedAt.Format(time.RFC3339))
		c.Logger.Error("Inbox: key reused with a different payload", err, fields)
		return nil, err
	}
	if rec.State != repository.StateCompleted {
		return nil, fmt.Errorf("%w: consumer %q, key %q is %s", ErrInProgress, c.Consumer, key, rec.State)
	}
	out, err := decodeResult(rec.Result)
	if err != nil {
		return nil, fmt.Errorf("inbox: replay key %q: %w", key, err)
	}
	c.Logger.Info("Inbox: duplicate acknowledged without running the handler", fields.Add(watermill.LogFields{"replayed": len(out)}))
	return out, nil
}
