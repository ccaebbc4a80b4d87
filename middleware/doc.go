// Package middleware provides Inbox, a Watermill router middleware that
// makes a handler's effects happen once per deduplication key on top of an
// at-least-once broker.
//
//	repo, _ := postgres.NewRepository(db, postgres.Config{})
//	inbox, err := middleware.NewInbox(middleware.Config{
//		DB:         db,
//		Repository: repo,
//		Consumer:   "billing",
//	})
//	if err != nil { … }
//	router.AddMiddleware(inbox.Middleware)
//
//	func charge(msg *message.Message) ([]*message.Message, error) {
//		tx, _ := middleware.TxFromContext(msg.Context())
//		_, err := tx.ExecContext(msg.Context(), "INSERT INTO charges …")
//		return nil, err // an error rolls back the charge and the marker together
//	}
//
// Permanent errors (ErrNoKey, ErrPayloadMismatch) are recognised by
// IsPermanent, which plugs into Watermill's PoisonQueueWithFilter.
package middleware
