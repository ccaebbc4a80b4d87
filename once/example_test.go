package once_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/watermill-idempotent/once"
	"github.com/idemkit/watermill-idempotent/repository/memory"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// A webhook delivered three times sends one e-mail: the two-phase Do on
// the in-memory store (Redis or a SQL backend in production).
func ExampleTwoPhase_Do() {
	sender, err := once.NewTwoPhase(once.TwoPhaseConfig{Repository: memory.NewRepository(), Scope: "welcome-email"})
	if err != nil {
		panic(err)
	}
	for range 3 {
		res, err := sender.Do(context.Background(), "user-42", func(ctx context.Context) ([]byte, error) {
			fmt.Println("sending the welcome e-mail")
			return []byte("message-id 1001"), nil
		})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s (replayed: %v)\n", res.Value, res.Replayed)
	}
	// Output:
	// sending the welcome e-mail
	// message-id 1001 (replayed: false)
	// message-id 1001 (replayed: true)
	// message-id 1001 (replayed: true)
}

// An ETL step re-run after a crash loads its batch once: the rows and the
// marker commit in one SQLite transaction.
func ExampleTransactional_Do() {
	dir, err := os.MkdirTemp("", "once-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "etl.db"))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := repo.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.Exec(`CREATE TABLE sales (day TEXT, amount INTEGER)`); err != nil {
		panic(err)
	}
	etl, err := once.NewTransactional(repo, once.Config{Scope: "load-sales"})
	if err != nil {
		panic(err)
	}
	load := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		res, err := tx.ExecContext(ctx, `INSERT INTO sales VALUES ('2026-11-30', 120), ('2026-11-30', 80)`)
		if err != nil {
			return nil, err
		}
		n, _ := res.RowsAffected()
		return fmt.Appendf(nil, "%d rows", n), nil
	}
	for range 2 {
		res, err := etl.DoInput(ctx, "sales/2026-11-30", []byte("sales-2026-11-30.csv sha256:…"), load)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s (replayed: %v)\n", res.Value, res.Replayed)
	}
	var total int
	if err := db.QueryRow(`SELECT SUM(amount) FROM sales`).Scan(&total); err != nil {
		panic(err)
	}
	fmt.Println("total:", total)
	// Output:
	// 2 rows (replayed: false)
	// 2 rows (replayed: true)
	// total: 200
}
