package dupetest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/idemkit/watermill-idempotent/dupetest"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

// The injector wrapped around a handler shows at once whether it is
// idempotent: a counter that adds on every delivery is not; the same
// counter behind a two-phase inbox is.
func Example() {
	deliver := func(h message.HandlerFunc) {
		dupes := dupetest.New(dupetest.Config{Seed: 1, Fraction: 0.5})
		wrapped := dupes.Middleware(h)
		for i := range 10 {
			if _, err := wrapped(message.NewMessage("payment-"+strconv.Itoa(i), []byte("1"))); err != nil {
				panic(err)
			}
		}
		dupes.Wait()
		s := dupes.Stats()
		fmt.Printf("10 messages, %d copies: ", s.Immediate+s.Late)
	}

	var balance atomic.Int32 // late copies arrive from other goroutines
	credit := func(msg *message.Message) ([]*message.Message, error) {
		balance.Add(1) // not idempotent: every copy adds again
		return nil, nil
	}
	deliver(credit)
	fmt.Println("balance without the inbox:", balance.Load())

	balance.Store(0)
	inbox, err := middleware.NewTwoPhaseInbox(middleware.TwoPhaseConfig{Repository: memory.NewRepository(), Consumer: "payments"})
	if err != nil {
		panic(err)
	}
	deliver(inbox.Middleware(credit))
	fmt.Println("balance with the inbox:", balance.Load())
	// Output:
	// 10 messages, 3 copies: balance without the inbox: 13
	// 10 messages, 3 copies: balance with the inbox: 10
}

// A handler behind the inbox writes its row with the *sql.DB instead of
// the inbox's transaction. Every delivery once is fine; a failure after
// the write is not: the inbox rolls back, the row stays, and the
// redelivery writes it again. With Inbox and State the injector fails
// each first attempt inside the inbox and reports the row that survived
// the rollback. (Compiled, not run: it needs a PostgreSQL server;
// TestStateCatchesAWriteOutsideTheTransaction runs the same on one.)
func Example_writesOutsideTheTransaction() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	repo, err := postgres.NewRepository(db, postgres.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := repo.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "orders"})
	if err != nil {
		log.Fatal(err)
	}

	dupes := dupetest.New(dupetest.Config{
		FailFirst: 1,                // every first attempt fails inside the inbox, after the handler
		Inbox:     inbox.Middleware, // the injector runs the inbox: do not add it to the router too
		State: func(msg *message.Message) (any, error) { // this message's effect
			var n int
			err := db.QueryRowContext(msg.Context(), `SELECT count(*) FROM orders WHERE id = $1`, msg.UUID).Scan(&n)
			return n, err
		},
	})
	placeOrder := dupes.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		// The mistake: db, not idempotency.Tx[*sql.Tx](msg.Context()).
		_, err := db.ExecContext(msg.Context(), `INSERT INTO orders (id) VALUES ($1)`, msg.UUID)
		return nil, err
	})

	_, err = placeOrder(message.NewMessage("order-1", nil))
	fmt.Println(errors.Is(err, dupetest.ErrOutsideTx))
	for _, err := range dupes.Stats().RollbackErrors { // in a test: require.Empty(t, dupes.Stats().RollbackErrors)
		fmt.Println(err)
	}
	// On a router: router.AddMiddleware(dupes.Middleware) in place of the
	// inbox, publish, wait, then the same Stats check.
}
