// Command mysql is a program on MySQL with the inbox, the outbox and the
// relay: TestDependencies checks that it links no pgx.
package main

import (
	"database/sql"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

func main() {
	db, _ := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/test")
	repo, _ := mysql.NewRepository(db, mysql.Config{})
	ob, _ := outbox.New(outbox.Config{Dialect: sqldialect.MySQL})
	_, _ = middleware.NewInbox(repo, middleware.Config{Consumer: "shop", Outputs: ob.Outputs("out")})
	_, _ = outbox.NewRelay(db, nil, outbox.RelayConfig{Dialect: sqldialect.MySQL})
}
