package middleware

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemkit/watermill-idempotent/internal/settings"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/repository"
)

// VersionGuardConfig configures a VersionGuard on transactions of type
// TTx (*sql.Tx, pgx.Tx: the inbox's).
type VersionGuardConfig[TTx any] struct {
	// Guard stores the last applied version per (scope, entity), in the
	// same database as the inbox (postgres.NewVersionStore or
	// NewPgxVersionStore, mysql.NewVersionStore, sqlite.NewVersionStore).
	// Required.
	Guard repository.VersionGuard[TTx]
	// Consumer is the scope used when the context carries none — outside
	// an inbox handler, with ApplyIfNewerTx and a transaction of the
	// caller's. Inside an inbox handler (either mode) the delivery's scope
	// is used (idempotency.ScopeFromContext), so two handlers guarding the same entity
	// never make each other's messages stale. Default: "" (ApplyIfNewer
	// and ApplyIfNewerTx fail with idempotency.ErrNoScope outside an inbox handler).
	// At most 255 bytes, valid UTF-8, no NUL byte.
	Consumer string
}

// Validate reports every problem with the configuration at once.
func (c VersionGuardConfig[TTx]) Validate() error {
	var errs []error
	if c.Guard == nil {
		errs = append(errs, errors.New("missing VersionGuardConfig.Guard"))
	}
	errs = append(errs, validateScoping("VersionGuardConfig", c.Consumer, nil, false)...)
	return settings.Invalid("version guard", errs)
}

// VersionGuard rejects stale messages for consumers that depend on order.
// A handler calls ApplyIfNewer with the entity and version the message
// carries before it writes anything:
//
//	func (h *handler) Handle(msg *message.Message) ([]*message.Message, error) {
//		ev := decode(msg)
//		if err := h.versions.ApplyIfNewer(msg.Context(), ev.OrderID, ev.Version); err != nil {
//			return nil, err // ErrStaleVersion: the Inbox acknowledges and skips
//		}
//		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
//		if err != nil {
//			return nil, err
//		}
//		_, err = tx.ExecContext(msg.Context(), "UPDATE orders SET status = $1 WHERE id = $2", ev.Status, ev.OrderID)
//		return nil, err
//	}
//
// The version is recorded in the inbox transaction, so it commits or rolls
// back together with the handler's writes. The Inbox acknowledges a
// handler error wrapping ErrStaleVersion, commits and reports
// OutcomeStaleVersion to its Observer (the stale counter) — so the
// handler must return at once: whatever it wrote before would commit.
// Versions are kept per scope: the scope of the inbox delivery the
// handler runs in (idempotency.ScopeFromContext), so one VersionGuard serves every
// handler of a router and handlers guarding the same entity each keep
// their own versions. A handler mapped with HandlerScopes keeps its
// versions too.
//
// VersionGuard is safe for concurrent use.
type VersionGuard[TTx any] struct {
	config VersionGuardConfig[TTx]
}

// NewVersionGuard validates config and returns a VersionGuard.
func NewVersionGuard[TTx any](config VersionGuardConfig[TTx]) (*VersionGuard[TTx], error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &VersionGuard[TTx]{config: config}, nil
}

// ApplyIfNewer records version as the last applied version of entity in
// the inbox transaction found in ctx (pass msg.Context()), under the
// delivery's scope. It returns nil when the version is newer than every
// version applied before in that scope — go on and apply the message —
// and an error wrapping ErrStaleVersion when an equal or newer one was
// already applied; nothing is written then. Concurrent deliveries for one
// entity wait for each other's transactions, so applied messages take
// effect in version order. It returns idempotency.ErrNoTransaction outside the
// transactional Inbox, and a wrapped storage error (the transaction must
// then be rolled back: return it).
func (g *VersionGuard[TTx]) ApplyIfNewer(ctx context.Context, entity string, version int64) error {
	tx, err := idempotency.Tx[TTx](ctx)
	if err != nil {
		return fmt.Errorf("version guard: entity %q: %w", entity, err)
	}
	return g.ApplyIfNewerTx(ctx, tx, entity, version)
}

// ApplyIfNewerTx is ApplyIfNewer in a transaction of the caller's, for
// handlers that manage their own (with the TwoPhaseInbox, or no inbox at
// all). The scope is the inbox delivery's when ctx comes from one
// (msg.Context() inside either inbox), otherwise VersionGuardConfig.Consumer;
// with neither it returns idempotency.ErrNoScope (permanent). The caller commits or
// rolls back; on ErrStaleVersion it should roll back and acknowledge the
// message.
func (g *VersionGuard[TTx]) ApplyIfNewerTx(ctx context.Context, tx TTx, entity string, version int64) error {
	scope, ok := idempotency.ScopeFromContext(ctx)
	if !ok {
		scope = g.config.Consumer
	}
	if scope == "" {
		return fmt.Errorf("version guard: entity %q: %w: not inside an inbox handler and VersionGuardConfig.Consumer is empty", entity, idempotency.ErrNoScope)
	}
	applied, err := g.config.Guard.Advance(ctx, tx, repository.AdvanceParams{
		Consumer: scope, Entity: entity, Version: version,
	})
	if err != nil {
		return fmt.Errorf("version guard: %w", err)
	}
	if !applied {
		return fmt.Errorf("%w: scope %q, entity %q, version %d is not newer than the applied one", ErrStaleVersion, scope, entity, version)
	}
	return nil
}
