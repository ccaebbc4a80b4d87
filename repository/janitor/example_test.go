package janitor_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/janitor"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// The janitor runs with the router: the plugin starts it when the router
// runs and it stops when the router closes. Close waits for it.
func ExampleJanitor_RouterPlugin() {
	dir, err := os.MkdirTemp("", "janitor-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "inbox.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := repo.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	// Two deliveries handled a week ago (their retention is over) and one
	// handled just now.
	now := time.Now()
	for key, handledAt := range map[string]time.Time{
		"order-1": now.Add(-8 * 24 * time.Hour),
		"order-2": now.Add(-8 * 24 * time.Hour),
		"order-3": now,
	} {
		if err := claim(ctx, repo, db, key, handledAt, handledAt.Add(7*24*time.Hour)); err != nil {
			log.Fatal(err)
		}
	}

	firstPass := make(chan struct{})
	j, err := janitor.NewJanitor(repo, janitor.Config{
		Interval: time.Minute,
		Observer: janitor.ObserverFunc(func(_ context.Context, b janitor.Batch) {
			fmt.Printf("janitor removed %d expired records\n", b.Deleted)
			if b.Deleted < janitor.DefaultBatchSize {
				close(firstPass) // one pass here: the next is a minute away
			}
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer j.Close()

	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		log.Fatal(err)
	}
	// router.AddConsumerHandler(…) with the inbox middleware goes here.
	router.AddPlugin(j.RouterPlugin())

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(ctx) }()
	<-firstPass

	if err := router.Close(); err != nil {
		log.Fatal(err)
	}
	if err := <-routerDone; err != nil {
		log.Fatal(err)
	}
	if err := j.Close(); err != nil { // waits until the janitor has stopped
		log.Fatal(err)
	}

	for _, key := range []string{"order-1", "order-2", "order-3"} {
		_, err := repo.Get(ctx, "billing", key)
		fmt.Printf("%s kept: %v\n", key, !errors.Is(err, repository.ErrNotFound))
	}

	// Output:
	// janitor removed 2 expired records
	// order-1 kept: false
	// order-2 kept: false
	// order-3 kept: true
}

// claim records a handled delivery, as the inbox middleware does.
func claim(ctx context.Context, repo *sqlite.Repository, db *sql.DB, key string, now, expiresAt time.Time) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := repo.Claim(ctx, tx, []repository.ClaimParams{{
		Consumer: "billing", Key: key, PayloadHash: repository.HashPayload([]byte(key)),
		Now: now, ExpiresAt: expiresAt,
	}}); err != nil {
		return err
	}
	return tx.Commit()
}
