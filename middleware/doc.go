// Package middleware is the Watermill adapter of watermill-idempotent:
// Inbox, a router middleware that makes a handler's effects happen once
// per deduplication key on top of an at-least-once broker, and its
// two-phase, natural-key and version-guard forms. What every entry point
// shares (Delivery, Outcome, Observer, the permanent errors) is in package
// idempotency; packages once, httpidem and outbox do not import this one.
//
// Watermill has a package named middleware too
// (message/router/middleware). A file that uses both imports one of them
// under another name:
//
//	import (
//		wmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
//		"github.com/idemkit/watermill-idempotent/middleware"
//	)
//
//	repo, _ := postgres.NewRepository(db, postgres.Config{})
//	inbox, err := middleware.NewInbox(repo, middleware.Config{
//		Consumer: "shop", // this service's name; required
//	})
//	if err != nil { … }
//	router.AddMiddleware(inbox.Middleware)
//	router.AddHandler("billing", "orders", sub, "payments", pub, charge) // scope "shop/billing"
//
//	func charge(msg *message.Message) ([]*message.Message, error) {
//		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
//		if err != nil {
//			return nil, err // not inside the inbox: retried, never run without it
//		}
//		_, err = tx.ExecContext(msg.Context(), "INSERT INTO charges …")
//		return nil, err // an error rolls back the charge and the marker together
//	}
//
// Records are kept per (scope, key). The scope is the Watermill handler's
// name (message.HandlerNameFromCtx) prefixed with the service's Consumer
// and ScopeSeparator ("shop/billing" above), so one inbox added to the
// whole router keeps every handler's keys apart, and services sharing the
// table keep theirs apart; Config.HandlerScopes maps a handler to an
// explicit scope (to keep keys across a rename or an upgrade). The
// handler sees its scope and key through idempotency.ScopeFromContext and
// idempotency.KeyFromContext.
//
// Permanent errors — idempotency.ErrNoKey, ErrPayloadMismatch,
// ErrNeedsIntervention (two-phase mode), ErrNoScope and ErrInvalidScope —
// are recognised by idempotency.IsPermanent, which plugs into Watermill's
// PoisonQueueWithFilter; every other error (the handler's, the
// database's, ErrInProgress) is retried.
package middleware
