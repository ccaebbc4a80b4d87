// Package pgxoutbox runs the transactional outbox on pgx/v5: messages are
// written in a pgx.Tx (a pgx inbox handler's included), the relay reads
// the outbox on a pgxpool.Pool, and LISTEN/NOTIFY wakes it on a native
// pgx connection.
//
//	ob, _ := outbox.New(outbox.Config{Dialect: postgres.Dialect})
//	_ = pgxoutbox.Migrate(ctx, ob, pool)
//	// in a transaction of yours, or an inbox handler's (idempotency.Tx[pgx.Tx]):
//	_ = pgxoutbox.WriteTx(ctx, ob, tx, outbox.Outgoing{Topic: "orders", Message: msg})
//	relay, _ := pgxoutbox.NewRelay(pool, publisher, outbox.RelayConfig{Dialect: postgres.Dialect, Logger: logger})
//
// A relay on database/sql (outbox.NewRelay with the pgx stdlib driver)
// gets its wake-up from Notifier. This package is the outbox's only link
// to pgx, so programs on MySQL or SQLite that import outbox never link it.
package pgxoutbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/sqlexec/pgxexec"
)

// WriteTx is outbox.Outbox.WriteTx in a pgx transaction: msgs are
// published by the relay if and only if tx commits. tx may be the pgx.Tx
// of a pgx inbox handler (idempotency.Tx[pgx.Tx]).
func WriteTx(ctx context.Context, ob *outbox.Outbox, tx pgx.Tx, msgs ...outbox.Outgoing) error {
	if tx == nil {
		return errors.New("outbox: tx is nil")
	}
	return ob.WriteOn(ctx, pgxexec.Exec(tx), msgs...)
}

// Outputs is outbox.Outbox.Outputs for an inbox on pgx
// (postgres.NewPgxRepository): the handler's outputs
// are written, bound for topic, in the delivery's pgx.Tx, so they commit
// or roll back with the marker and the handler's writes.
func Outputs(ob *outbox.Outbox, topic string) OutputWriter {
	return OutputWriter{ob, topic}
}

// OutputWriter writes a pgx inbox handler's outputs into an outbox, in
// the delivery's pgx.Tx (idempotency.Tx); Outputs makes one. It satisfies middleware.OutputWriter.
type OutputWriter struct {
	ob    *outbox.Outbox
	topic string
}

// WriteOutputs writes msgs in the pgx transaction of ctx.
func (w OutputWriter) WriteOutputs(ctx context.Context, msgs []*message.Message) error {
	tx, err := idempotency.Tx[pgx.Tx](ctx)
	if err != nil {
		return fmt.Errorf("pgxoutbox: write outputs: %w (on database/sql, use outbox.Outbox.Outputs)", err)
	}
	out := make([]outbox.Outgoing, len(msgs))
	for i, m := range msgs {
		out[i] = outbox.Outgoing{Topic: w.topic, Message: m}
	}
	return WriteTx(ctx, w.ob, tx, out...)
}

// NewRelay is outbox.NewRelay on a pgx pool: every batch is a pgx
// transaction. Unless config.Notifier is set or config.DisableNotify,
// the relay LISTENs on a connection of pool (PoolNotifier).
func NewRelay(pool *pgxpool.Pool, publisher message.Publisher, config outbox.RelayConfig) (*outbox.Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: relay: pool is nil")
	}
	if config.Notifier == nil {
		config.Notifier = PoolNotifier(pool)
	}
	return outbox.NewRelayOn(pgxexec.Pool(pool), publisher, config)
}

// Migrate is outbox.Outbox.Migrate on a pgx pool.
func Migrate(ctx context.Context, ob *outbox.Outbox, pool *pgxpool.Pool) error {
	if pool == nil {
		return errors.New("outbox: migrate: pool is nil")
	}
	return ob.MigrateOn(ctx, pgxexec.Pool(pool))
}

// NewDeadLetters is outbox.NewDeadLetters on a pgx pool.
func NewDeadLetters(pool *pgxpool.Pool, config outbox.Config) (*outbox.DeadLetters, error) {
	if pool == nil {
		return nil, errors.New("outbox: dead letters: pool is nil")
	}
	return outbox.NewDeadLettersOn(pgxexec.Pool(pool), config)
}

// PoolNotifier returns an outbox.Notifier that holds one connection of
// pool in LISTEN while the relay runs. The connection is closed, not
// returned to the pool, when listening ends.
func PoolNotifier(pool *pgxpool.Pool) outbox.Notifier {
	return notifier(func(ctx context.Context, use func(*pgx.Conn) error) error {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("outbox: relay: listen: %w", err)
		}
		// A connection left in LISTEN must not serve other queries: it
		// leaves the pool and is closed.
		pc := conn.Hijack()
		defer pc.Close(context.Background())
		return use(pc)
	})
}

// Notifier returns an outbox.Notifier for a relay on database/sql: it
// holds one connection of db in LISTEN while the relay runs. db must use
// the pgx/v5 stdlib driver ("pgx"); with another driver Listen fails with
// errors.ErrUnsupported and the relay polls.
func Notifier(db *sql.DB) outbox.Notifier {
	return notifier(func(ctx context.Context, use func(*pgx.Conn) error) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return fmt.Errorf("outbox: relay: listen: %w", err)
		}
		defer conn.Close()
		return conn.Raw(func(dc any) error {
			sc, ok := dc.(*stdlib.Conn)
			if !ok {
				return fmt.Errorf("LISTEN/NOTIFY needs the pgx/v5 stdlib driver, the connection is %T: %w", dc, errors.ErrUnsupported)
			}
			// A listening connection must not go back to the pool:
			// ErrBadConn makes database/sql close it.
			return fmt.Errorf("%w: %w", use(sc.Conn()), driver.ErrBadConn)
		})
	})
}

// notifier is an outbox.Notifier given by how it gets a connection of
// its own: it calls use with one that no other query will share, and
// closes it when use returns.
type notifier func(ctx context.Context, use func(*pgx.Conn) error) error

// Listen implements outbox.Notifier.
func (n notifier) Listen(ctx context.Context, channel string, wake func()) error {
	return n(ctx, func(conn *pgx.Conn) error { return listen(ctx, conn, channel, wake) })
}

// listen runs LISTEN on conn and calls wake once and after every
// notification, until ctx ends or the connection fails.
func listen(ctx context.Context, conn *pgx.Conn, channel string, wake func()) error {
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fmt.Errorf("outbox: relay: LISTEN: %w", err)
	}
	wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("outbox: relay: wait for notification: %w", err)
		}
		wake()
	}
}
