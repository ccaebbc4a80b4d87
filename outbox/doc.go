// Package outbox is the producer side of effectively-once processing: a
// transactional outbox and a relay.
//
// Messages are written into an outbox table inside the caller's SQL
// transaction, so they exist if and only if the business data they
// describe committed. A Relay forwards them to any Watermill publisher
// (AMQP, Kafka, GoChannel, …) at least once with their UUIDs unchanged,
// so an inbox on the consuming side (package middleware) dedupes the
// repeats a crash can cause.
//
//	ob, err := outbox.New(outbox.Config{Dialect: postgres.Dialect})
//	if err != nil { … }
//	if err := ob.Migrate(ctx, db); err != nil { … } // or apply migrations/postgres
//
//	// Producer: business write and message commit together.
//	tx, _ := db.BeginTx(ctx, nil)
//	_, _ = tx.ExecContext(ctx, `INSERT INTO orders …`)
//	err = ob.InTx(tx).Publish("orders.created", message.NewMessage(watermill.NewUUID(), payload))
//	err = tx.Commit()
//
//	// Relay: outbox → broker.
//	relay, err := outbox.NewRelay(db, amqpPublisher, outbox.RelayConfig{
//		Dialect:  postgres.Dialect,
//		Notifier: pgxoutbox.Notifier(db), // LISTEN/NOTIFY wake-up; PostgreSQL only
//		Logger:   logger,
//	})
//	go func() { _ = relay.Run(ctx) }()
//	defer relay.Close()
//
// Writing uses watermill-sql's Publisher over the caller's *sql.Tx with a
// schema adapter that stores the payload as bytes (BYTEA / LONGBLOB), the
// metadata as JSON and the destination topic in its own column. Reading
// is this package's own: the relay claims rows with
// SELECT … FOR UPDATE SKIP LOCKED, publishes them and deletes them in
// batches, so a transaction that commits late (holding an earlier id)
// is never skipped, and several relays can share one table. On
// PostgreSQL a statement-level trigger sends NOTIFY on commit and the
// relay LISTENs through RelayConfig.Notifier, with polling as the
// fallback. Package outbox/pgxoutbox holds everything that needs pgx —
// the LISTEN, writing in a pgx.Tx, the relay on a pgxpool.Pool — so that
// this package links no driver. A message the publisher
// keeps refusing is isolated and, after RelayConfig.MaxAttempts, moved to
// a dead-letter table that DeadLetters lists and requeues; batches are
// bounded by bytes (MaxBatchBytes); Close finishes the batch in flight
// within CloseTimeout. docs/outbox.md explains
// the guarantees per database and why watermill-sql's subscriber is not
// used for reading.
package outbox
