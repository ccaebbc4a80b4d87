// Command postgres is a program on pgx with the inbox, the outbox, the
// relay and its LISTEN: TestDependencies checks that it does link pgx,
// so that the check on the other programs can fail.
package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/outbox/pgxoutbox"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func main() {
	pool, _ := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:5432/test")
	repo, _ := postgres.NewPgxRepository(pool, postgres.Config{})
	ob, _ := outbox.New(outbox.Config{Dialect: sqldialect.PostgreSQL})
	_, _ = middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Outputs: pgxoutbox.Outputs(ob, "out")})
	_, _ = pgxoutbox.NewRelay(pool, nil, outbox.RelayConfig{Dialect: sqldialect.PostgreSQL})
}
