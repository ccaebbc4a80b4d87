package main

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// pgxDB runs the scenarios' handlers on pgx/v5 natively (a pgxpool.Pool)
// instead of database/sql; tables are still created and counted through
// pg.
type pgxDB struct {
	pg   *database
	pool *pgxpool.Pool
	rt   *roundTrips
}

func openPgxPool(ctx context.Context, dsn string, conns int, rt *roundTrips) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = int32(conns), 0
	cfg.ConnConfig.DialFunc = rt.dial
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func (p *pgxDB) deliver(ctx context.Context, h message.HandlerFunc, msgs []*message.Message, c int) (result, error) {
	return countRoundTrips(p.rt, func() (result, error) { return deliver(ctx, h, msgs, c) })
}

// bare is A's handler on pgx: BEGIN, INSERT, COMMIT.
func (p *pgxDB) bare(b *business) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := p.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, b.insertSQL, msg.UUID, len(msg.Payload)); err != nil {
			return nil, errors.Join(err, tx.Rollback(ctx))
		}
		return nil, tx.Commit(ctx)
	}
}

// inInbox is B's handler on pgx: the INSERT in the inbox's pgx.Tx.
func inInboxPgx(b *business) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		tx, err := idempotency.Tx[pgx.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		_, err = tx.Exec(msg.Context(), b.insertSQL, msg.UUID, len(msg.Payload))
		return nil, err
	}
}

// scenarioBarePgx is A on pgx.
func scenarioBarePgx(ctx context.Context, p *pgxDB, n, c int) (result, error) {
	t := &tables{d: p.pg}
	defer t.drop()
	b, err := newBusiness(ctx, p.pg, t, "bench_a")
	if err != nil {
		return result{}, err
	}
	r, err := p.deliver(ctx, p.bare(b), newMessages(n), c)
	if err != nil {
		return result{}, err
	}
	return r, b.expect(ctx, n)
}

// newInbox returns an inbox on a fresh table whose transactions are
// pgx's (postgres.NewPgxRepository: BEGIN and the claim in one round
// trip).
func (p *pgxDB) newInbox(ctx context.Context, t *tables, mutate ...func(*middleware.Config)) (*middleware.Inbox, error) {
	repo, err := p.newRepo(ctx, t)
	if err != nil {
		return nil, err
	}
	config := middleware.Config{Consumer: "bench"}
	for _, m := range mutate {
		m(&config)
	}
	return middleware.NewInbox(repo, config)
}

// newRepo returns a pgx repository on a fresh, migrated inbox table.
func (p *pgxDB) newRepo(ctx context.Context, t *tables) (*postgres.Repository[pgx.Tx], error) {
	repo, err := postgres.NewPgxRepository(p.pool, postgres.Config{Table: t.add("bench_inbox_" + randomSuffix())})
	if err != nil {
		return nil, err
	}
	return repo, repo.Migrate(ctx)
}

// inboxRun creates a business table and a pgx inbox for one run.
func (p *pgxDB) inboxRun(ctx context.Context, t *tables, prefix string, mutate []func(*middleware.Config)) (*business, message.HandlerFunc, error) {
	b, err := newBusiness(ctx, p.pg, t, prefix)
	if err != nil {
		return nil, nil, err
	}
	inbox, err := p.newInbox(ctx, t, mutate...)
	if err != nil {
		return nil, nil, err
	}
	return b, inbox.Middleware(inInboxPgx(b)), nil
}

// scenarioInboxPgx is B on pgx.
func scenarioInboxPgx(ctx context.Context, p *pgxDB, n, c int, mutate ...func(*middleware.Config)) (result, error) {
	t := &tables{d: p.pg}
	defer t.drop()
	b, h, err := p.inboxRun(ctx, t, "bench_b", mutate)
	if err != nil {
		return result{}, err
	}
	r, err := p.deliver(ctx, h, newMessages(n), c)
	if err != nil {
		return result{}, err
	}
	return r, b.expect(ctx, n)
}

// scenarioDuplicatesPgx is C on pgx: it returns the second pass.
func scenarioDuplicatesPgx(ctx context.Context, p *pgxDB, n, c int, mutate ...func(*middleware.Config)) (result, error) {
	t := &tables{d: p.pg}
	defer t.drop()
	b, h, err := p.inboxRun(ctx, t, "bench_c", mutate)
	if err != nil {
		return result{}, err
	}
	msgs := newMessages(n)
	if _, err := p.deliver(ctx, h, msgs, c); err != nil {
		return result{}, err
	}
	dup, err := p.deliver(ctx, h, copies(msgs), c)
	if err != nil {
		return result{}, err
	}
	return dup, b.expect(ctx, n)
}
