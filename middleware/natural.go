package middleware

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/repository"
)

// ErrNaturalDuplicate is returned by a handler that detected by itself
// that its business row already exists — for example an
// INSERT … ON CONFLICT DO NOTHING that affected no row, which on
// PostgreSQL avoids aborting the transaction. NaturalKey acknowledges it
// as a duplicate, like a unique violation.
var ErrNaturalDuplicate = errors.New("business row already exists")

// NaturalKeyConfig configures a NaturalKey.
type NaturalKeyConfig struct {
	// Consumer names the deliveries in logs and in the Delivery given to
	// the Observer, with the inbox's rule: the handler name, prefixed with
	// Consumer and ScopeSeparator when it is set, or Consumer alone
	// outside a router. NaturalKey stores nothing under it — the business
	// row is the marker — so it only labels, and is optional; set it to
	// the service's name, like the inbox's. Default: "" (the handler
	// name).
	Consumer string
	// IsDuplicate reports whether a handler error means "this message was
	// already applied". Default: repository.IsUniqueViolation (PostgreSQL,
	// SQLite, and MySQL/MariaDB once repository/mysql is imported), or'ed
	// with errors.Is(err, ErrNaturalDuplicate).
	IsDuplicate func(error) bool
	// Observer: as in Config (mode "natural"), with these outcomes:
	// OutcomeProcessed, OutcomeDuplicate or OutcomeFailed. Default: nil
	// (none).
	Observer idempotency.Observer
	// Logger receives one line per duplicate. Default: watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// NaturalKey is a router middleware for handlers whose business row is
// itself the deduplication marker: the row has a unique (or primary) key
// derived from the message — an order id, a payment id — so a second
// application fails on the constraint. No inbox table is involved.
//
// When the handler returns an error that IsDuplicate recognises (by
// driver error code, never message text; wrapped errors count), NaturalKey
// acknowledges the delivery as a duplicate: it returns no messages and no
// error. Every other error is returned unchanged, so it is retried.
//
// The handler must own its transaction: do the unique insert, the rest of
// the writes and the commit in one transaction, and on error roll it back
// and return the error wrapped with %w. On PostgreSQL a failed statement
// aborts the whole transaction, so nothing after the violating insert can
// run in it: put the insert first, use a savepoint, or use
// INSERT … ON CONFLICT DO NOTHING and return ErrNaturalDuplicate when it
// affected no row.
//
// What it cannot do, compared with the Inbox: it does not replay the
// first delivery's output messages (publish them through the outbox in
// the same transaction instead), and it cannot tell a redelivery from a
// different message that reuses the key (no payload comparison).
//
// Inside the transactional Inbox (on any driver) a
// duplicate is not acknowledged: the inbox's transaction may be aborted
// (PostgreSQL) and committing it would fail on every redelivery. Place
// NaturalKey outside the Inbox instead — the Inbox then rolls back and
// NaturalKey acknowledges — or rely on the Inbox's own marker.
//
// NaturalKey is safe for concurrent use.
type NaturalKey struct {
	config NaturalKeyConfig
	scope  scoping
	obs    observability
}

// modeNatural is NaturalKey's idempotency.mode.
const modeNatural = idempotency.ModeNatural

// NewNaturalKey returns a NaturalKey with config's defaults applied.
func NewNaturalKey(config NaturalKeyConfig) *NaturalKey {
	if config.IsDuplicate == nil {
		config.IsDuplicate = func(err error) bool {
			return errors.Is(err, ErrNaturalDuplicate) || repository.IsUniqueViolation(err)
		}
	}
	if config.Logger == nil {
		config.Logger = watermill.NopLogger{}
	}
	return &NaturalKey{
		config: config,
		scope:  newScoping(config.Consumer, nil),
		obs:    newObservability(modeNatural, config.Logger, config.Observer),
	}
}

// Middleware wraps h; add it to a router or a single handler.
func (n *NaturalKey) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		name, scopeErr := n.scope.resolve(msg.Context())
		if scopeErr != nil {
			name = n.scope.fallback() // only a label here: never fail the delivery for it
		}
		obs, ctx := n.obs.begin(msg, name)
		original := msg.Context()
		msg.SetContext(ctx)
		out, panicked, err := runRecovered(h, msg)
		msg.SetContext(original)
		if panicked != nil {
			_ = obs.end(ctx, idempotency.OutcomeFailed, err, nil)
			panic(panicked) // reported: now for Recoverer or the process, as without NaturalKey
		}
		switch {
		case err == nil:
			return out, obs.end(ctx, idempotency.OutcomeProcessed, nil, nil)
		case !n.config.IsDuplicate(err):
			return nil, obs.end(ctx, idempotency.OutcomeFailed, err, nil)
		case inInboxTx(original):
			err = fmt.Errorf("natural key: a duplicate inside the inbox transaction cannot be acknowledged (place NaturalKey outside the Inbox): %w", err)
			return nil, obs.end(ctx, idempotency.OutcomeFailed, err, nil)
		}
		// The row is the marker: acknowledged; the error is only logged.
		return nil, obs.end(ctx, idempotency.OutcomeDuplicate, nil, watermill.LogFields{"err": err})
	}
}

// runRecovered runs h, recovering its panic: panicked is what it
// panicked with, and err says so.
func runRecovered(h message.HandlerFunc, msg *message.Message) (out []*message.Message, panicked any, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, panicked, err = nil, r, fmt.Errorf("handler panicked: %v", r)
		}
	}()
	out, err = h(msg)
	return out, nil, err
}
