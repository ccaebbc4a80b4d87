// Command sqlite is a program on SQLite with the inbox, the outbox and
// the relay: TestDependencies checks that it links no pgx.
package main

import (
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func main() {
	db, _ := sqlite.Open("app.db")
	repo, _ := sqlite.NewRepository(db, sqlite.Config{})
	ob, _ := outbox.New(outbox.Config{Dialect: sqldialect.SQLite})
	_, _ = middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Outputs: ob.Outputs("out")})
	_, _ = outbox.NewRelay(db, nil, outbox.RelayConfig{Dialect: sqldialect.SQLite})
}
