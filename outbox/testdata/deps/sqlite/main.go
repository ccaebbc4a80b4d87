// Command sqlite is a program on SQLite with the inbox, the outbox and
// the relay: TestDependencies checks that it links no pgx.
package main

import (
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

func main() {
	db, _ := sqlite.Open("app.db")
	repo, _ := sqlite.NewRepository(db, sqlite.Config{})
	ob, _ := outbox.New(outbox.Config{Dialect: outbox.SQLite})
	_, _ = middleware.NewInbox(middleware.Config{DB: db, Repository: repo, Consumer: "shop", Consumer: "shop", Outputs: ob.Outputs("out")})
	_, _ = outbox.NewRelay(db, nil, outbox.RelayConfig{Dialect: outbox.SQLite}, nil)
}
