// Command cpucost measures the CPU time each delivery costs, in this
// process (Go: the handler chain, database/sql, pgx) and in the
// PostgreSQL backends serving it (read from /proc, found by
// application_name), for the bare handler (A), the inbox (B) and the
// inbox with group commit (G). Unlike throughput on a shared machine, CPU
// per delivery does not depend on how busy the machine is: on an idle
// one, throughput at saturation is the cores divided by it.
//
//	go run ./bench/cpucost -n 16000 -c 16
//	go run ./bench/cpucost -cpuprofile cpu.out   # where the Go side's time goes
//	go run ./bench/cpucost -only G16 -cpuprofile g.out   # one mode's profile
//
// The handlers run without a router, c goroutines at once. PostgreSQL
// must run on this machine (the backends' /proc entries are read). It
// creates its own tables (random suffix) and drops them at the end.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/idemkit/watermill-idempotent/bench/internal/proc"
	"github.com/idemkit/watermill-idempotent/idempotency"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
)

func main() {
	n := flag.Int("n", 16000, "deliveries per run")
	c := flag.Int("c", 16, "deliveries in flight")
	repeat := flag.Int("repeat", 2, "runs of each mode")
	prof := flag.String("cpuprofile", "", "write a CPU profile to this file")
	only := flag.String("only", "", "comma-separated modes to run (A, B, G16, G8 for c = 16: the letter and the batch size); default all")
	flag.Parse()
	if *prof != "" {
		f, err := os.Create(*prof)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "cpucost:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(*n, *c, *repeat, *only); err != nil {
		fmt.Fprintln(os.Stderr, "cpucost:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(n, c, repeat int, only string) error {
	var b [6]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	app := "cpucost_" + suffix
	dsn := testenv.PostgresDSN()
	db, err := sql.Open("pgx", proc.AppDSN(dsn, app))
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(c + 4)
	db.SetMaxIdleConns(c + 4)
	monitor, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer monitor.Close()

	biz, inbox := "cpucost_orders_"+suffix, "cpucost_inbox_"+suffix
	if _, err := db.Exec(`CREATE TABLE ` + biz + ` (id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL)`); err != nil {
		return err
	}
	defer db.Exec(`DROP TABLE IF EXISTS ` + biz)
	repo, err := postgres.NewRepository(db, postgres.Config{Table: inbox})
	if err != nil {
		return err
	}
	defer db.Exec(`DROP TABLE IF EXISTS ` + inbox)
	if err := repo.Migrate(context.Background()); err != nil {
		return err
	}
	insert := `INSERT INTO ` + biz + ` (id, amount) VALUES ($1, 1)`

	bare := func(msg *message.Message) ([]*message.Message, error) {
		tx, err := db.BeginTx(msg.Context(), nil)
		if err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(msg.Context(), insert, msg.UUID); err != nil {
			return nil, errors.Join(err, tx.Rollback())
		}
		return nil, tx.Commit()
	}
	inInbox := func(msg *message.Message) ([]*message.Message, error) {
		tx, err := idempotency.Tx[*sql.Tx](msg.Context())
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(msg.Context(), insert, msg.UUID)
		return nil, err
	}
	withInbox := func(batch middleware.BatchConfig) (message.HandlerFunc, error) {
		i, err := middleware.NewInbox(repo, middleware.Config{Consumer: "cpucost", Batch: batch})
		if err != nil {
			return nil, err
		}
		return i.Middleware(inInbox), nil
	}
	plain, err := withInbox(middleware.BatchConfig{})
	if err != nil {
		return err
	}
	grouped, err := withInbox(middleware.BatchConfig{MaxMessages: c})
	if err != nil {
		return err
	}
	halves, err := withInbox(middleware.BatchConfig{MaxMessages: max(c/2, 2)})
	if err != nil {
		return err
	}
	type mode struct {
		id, name string
		h        message.HandlerFunc
	}
	modes := []mode{
		{"A", "A bare", bare},
		{"B", "B inbox", plain},
		{fmt.Sprintf("G%d", c), fmt.Sprintf("G batch %d", c), grouped},
		{fmt.Sprintf("G%d", max(c/2, 2)), fmt.Sprintf("G batch %d", max(c/2, 2)), halves},
	}
	if only != "" {
		ids := strings.Split(only, ",")
		for _, id := range ids {
			if !slices.ContainsFunc(modes, func(m mode) bool { return m.id == id }) {
				return fmt.Errorf("-only: unknown mode %q (modes at -c %d: A, B, G%d, G%d)", id, c, c, max(c/2, 2))
			}
		}
		modes = slices.DeleteFunc(modes, func(m mode) bool { return !slices.Contains(ids, m.id) })
	}
	fmt.Printf("cpucost: %d deliveries per run, %d in flight, load average %s\n", n, c, proc.LoadAverage())
	if _, err := measure(monitor, app, "warm-up", bare, n/4, c); err != nil {
		return err
	}
	for range repeat {
		for _, m := range modes {
			line, err := measure(monitor, app, m.name, m.h, n, c)
			if err != nil {
				return err
			}
			fmt.Println(line)
		}
	}
	fmt.Printf("load average at the end %s\n", proc.LoadAverage())
	return nil
}

// measure runs n deliveries through h, c at a time.
func measure(monitor *sql.DB, app, name string, h message.HandlerFunc, n, c int) (string, error) {
	prefix := strings.ReplaceAll(name, " ", "-") + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	pg0, err := backendCPU(monitor, app)
	if err != nil {
		return "", err
	}
	go0, start := processCPU(), time.Now()
	errs := make([]error, c)
	var wg sync.WaitGroup
	for g := range c {
		wg.Go(func() {
			for i := g; i < n && errs[g] == nil; i += c {
				_, errs[g] = h(message.NewMessage(fmt.Sprintf("%s-%d", prefix, i), []byte("{}")))
			}
		})
	}
	wg.Wait()
	elapsed, goCPU := time.Since(start), processCPU()-go0
	if err := errors.Join(errs...); err != nil {
		return "", err
	}
	pg1, err := backendCPU(monitor, app)
	if err != nil {
		return "", err
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	return fmt.Sprintf("%-12s %7.0f msgs/s   CPU per delivery: Go %5.1f µs + PostgreSQL %5.1f µs = %5.1f µs",
		name, float64(n)/elapsed.Seconds(), per(goCPU), per(pg1-pg0), per(goCPU+pg1-pg0)), nil
}

// backendCPU sums the user and system time of the PostgreSQL backends
// whose application_name is app.
func backendCPU(monitor *sql.DB, app string) (time.Duration, error) {
	pids, err := proc.Backends(context.Background(), monitor, app)
	if err != nil {
		return 0, err
	}
	var ticks int64
	for _, pid := range pids {
		t, err := proc.Ticks(pid)
		if err != nil {
			return 0, fmt.Errorf("PostgreSQL must run on this machine: %w", err)
		}
		ticks += t
	}
	return time.Duration(ticks) * time.Second / proc.ClockTicks, nil
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
