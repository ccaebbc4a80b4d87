package middleware_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/idempotency"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// Group commit: eight deliveries in flight at once (eight router
// handlers, partitions or prefetched messages) share one transaction and
// one commit; each returns, and is acked, only after that commit.
func ExampleBatchConfig() {
	dir, _ := os.MkdirTemp("", "example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(filepath.Join(dir, "app.db"))
	defer db.Close()
	repo, _ := sqlite.NewRepository(db, sqlite.Config{})
	_ = repo.Migrate(context.Background())
	_, _ = db.Exec(`CREATE TABLE charges (order_id TEXT)`)

	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "billing",
		Batch: middleware.BatchConfig{MaxMessages: 8, MaxWait: time.Second},
	})
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	txs := map[any]int{}
	charge := inbox.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		mu.Lock()
		txs[tx]++
		mu.Unlock()
		_, err = tx.ExecContext(msg.Context(), `INSERT INTO charges VALUES (?)`, string(msg.Payload))
		return nil, err
	})

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := fmt.Sprintf("order-%d", i)
			if _, err := charge(message.NewMessage(id+"-uuid", []byte(id))); err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	var n int
	_ = db.QueryRow(`SELECT COUNT(*) FROM charges`).Scan(&n)
	fmt.Println("charges:", n, "transactions:", len(txs))
	// Output:
	// charges: 8 transactions: 1
}
