// Command bench measures what the inbox costs, side by side with the bare
// handler, Watermill's own options and the database's limit, on this
// machine, in one run. See docs/benchmarks.md.
//
//	go run ./bench                 # default: 2,000 messages per run, concurrency 1, 4, 16
//	go run ./bench -n 20000        # a larger run
//	go run ./bench -soak           # 1,000,000 messages through B with the janitor running
//	go run ./bench -rtt 500us      # every database round trip costs 500 µs more, as across a network
//
// Every message goes through a Watermill router (GoChannel). Scenarios:
//
//	A  bare handler: one INSERT in its own transaction (the floor)
//	B  the same INSERT behind middleware.Inbox (transactional mode)
//	C  B with every message delivered twice: the second pass (all duplicates)
//	N  B and C with the adaptive read off (every duplicate answered in a transaction)
//	R  B and C with ReadFirst always on
//
// A, B, C and N run on database/sql (backend "postgres") and on pgx/v5
// natively (backend "pgx"). Round trips are counted on the wire for every
// PostgreSQL and MariaDB run (the rt/msg column; see roundtrips.go), and
// -rtt delays each of them, Redis's and pgbench's too (through a proxy).
//
//	W  watermill-sql v3's subscriber, the handler writing through its transaction
//	D  Watermill's Deduplicator (in-memory) around A's handler
//	E  A and B on SQLite and MariaDB; the two-phase inbox on Redis around A's handler
//	F  pgbench, one autocommit INSERT per transaction (the database's limit);
//	   also pgbench replaying A's and B's statements (no Go, no router)
//
// Addresses come from POSTGRES_DSN, MYSQL_DSN and REDIS_ADDR with the
// test suite's localhost defaults.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemkit/watermill-idempotent/bench/internal/proc"
	"github.com/idemkit/watermill-idempotent/bench/internal/stats"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
)

// cell is one scenario on one backend at one concurrency: a line of the
// table, run once a repetition.
type cell struct {
	label, backend string
	c              int
}

// row is one line of the table.
type row struct {
	id, label, backend string
	c                  int
	r                  result
	err                error
}

type options struct {
	n            int
	repeat       int
	concurrency  []int
	only         map[string]bool
	backends     map[string]bool
	pgbench      string
	cpuProfile   string
	memProfile   string
	soak         bool
	soakN        int
	soakC        int
	soakExpired  int
	soakInterval time.Duration
	janitorBatch int
	janitorPause time.Duration
	batchMax     int
	batchWait    time.Duration
	batchFixed   bool
	poolN        int
	rtt          time.Duration
	pool         int
	poolC        int
}

func main() {
	var o options
	var conc, only, backends string
	flag.IntVar(&o.n, "n", 2000, "messages per run")
	flag.IntVar(&o.repeat, "repeat", 3, "runs per scenario and concurrency; the table shows the run with the median throughput")
	flag.StringVar(&conc, "c", "1,4,16", "comma-separated handler concurrencies")
	flag.StringVar(&only, "only", "", "comma-separated scenarios to run (A,B,C,N,R,W,D,E,F,G,P,M; M is A and B on RabbitMQ, NATS JetStream and Kafka, N and R are B and C with the adaptive read off and with ReadFirst, P is A, B and G over a pool of -pool connections at -pool-c); default all")
	flag.StringVar(&backends, "backends", "", "comma-separated backends to run (postgres, pgx, sqlite, mariadb, redis+pg, rabbitmq, nats, kafka); default all. The database/sql and pgx pools each keep up to the largest -c + 4 connections: where the two exceed PostgreSQL's max_connections (at -c 64 against the default 100), run postgres and pgx apart")
	flag.StringVar(&o.pgbench, "pgbench", "/usr/bin/pgbench", "path of pgbench (scenario F); skipped if missing")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile at the end to this file")
	flag.BoolVar(&o.soak, "soak", false, "run the soak instead of the comparison")
	flag.IntVar(&o.soakN, "soak-n", 1_000_000, "soak: messages through B")
	flag.IntVar(&o.soakC, "soak-c", 4, "soak: handler concurrency")
	flag.IntVar(&o.soakExpired, "soak-expired", 1_000_000, "soak: expired records seeded for the janitor to delete")
	flag.DurationVar(&o.soakInterval, "soak-interval", 10*time.Second, "soak: report interval")
	flag.IntVar(&o.janitorBatch, "soak-janitor-batch", 0, "soak: janitor BatchSize (0: the janitor's default)")
	flag.DurationVar(&o.janitorPause, "soak-janitor-pause", 0, "soak: janitor Pause (0: the janitor's default)")
	flag.IntVar(&o.batchMax, "batch-max", 0, "G: Batch.MaxMessages (0: half the concurrency c, at least 1)")
	flag.DurationVar(&o.batchWait, "batch-wait", middleware.DefaultBatchMaxWait, "G: Batch.MaxWait")
	flag.BoolVar(&o.batchFixed, "batch-fixed", false, "G: Batch.Fixed (every batch's limit is -batch-max; no adaptation)")
	flag.IntVar(&o.pool, "pool", 8, "P: the connection pool's size in the connection-limited scenario (A, B and G over p connections)")
	flag.IntVar(&o.poolN, "pool-n", 10000, "P: messages per run in the connection-limited scenario (more than -n: group commit's adaptation spends its first few hundred deliveries probing, a large share of a run of 2,000 at 64 in flight)")
	flag.IntVar(&o.poolC, "pool-c", 64, "P: deliveries in flight in the connection-limited scenario; 0: no such scenario")
	flag.DurationVar(&o.rtt, "rtt", 0, "network round-trip time added to every round trip to PostgreSQL, MariaDB and Redis (pgbench through a proxy); 0: loopback as it is")
	flag.Parse()
	for _, s := range strings.Split(conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 {
			fatalf("bad -c %q", conc)
		}
		o.concurrency = append(o.concurrency, c)
	}
	o.only = commaSet(only, strings.ToUpper)
	o.backends = commaSet(backends, strings.ToLower)
	if o.n < 1 || o.repeat < 1 {
		fatalf("-n and -repeat must be positive")
	}
	if o.rtt < 0 {
		fatalf("-rtt must not be negative")
	}
	if o.poolC > 0 && (o.pool < 1 || o.pool >= o.poolC) {
		fatalf("-pool must be between 1 and -pool-c - 1")
	}

	if o.rtt > 0 {
		// A delayed round trip sleeps in nanosleep (sleepRTT), holding its
		// thread's P until sysmon takes the P back, which takes up to 10 ms
		// once sysmon has backed off: with GOMAXPROCS 2, two sleeping
		// connections stalled the rest (database/sql's B at c = 16 and
		// -rtt 1ms ran at 450 or 2,600 msgs/s, run by run). One P per
		// connection that can sleep at once, and some to spare.
		runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 2*slices.Max(append(o.concurrency, o.poolC))+8))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fatalf("%v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatalf("%v", err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	var err error
	if o.soak {
		err = runSoak(ctx, o, os.Stdout)
	} else {
		err = runComparison(ctx, o, os.Stdout)
	}
	if o.memProfile != "" {
		if f, ferr := os.Create(o.memProfile); ferr == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}

// openPostgres opens database/sql over pgx's stdlib driver, counting
// round trips with rt.
func openPostgres(dsn string, rt *roundTrips) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DialFunc = rt.dial
	return ping(stdlib.OpenDB(*cfg))
}

// openMySQL opens database/sql over go-sql-driver/mysql, counting round
// trips with rt (a dialer registered under a network name of its own).
func openMySQL(dsn string, rt *roundTrips) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if cfg.Net == "tcp" {
		mysql.RegisterDialContext("bench-counted", func(ctx context.Context, addr string) (net.Conn, error) {
			return rt.dial(ctx, "tcp", addr)
		})
		cfg.Net = "bench-counted"
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	return ping(sql.OpenDB(conn))
}

// pgHostPort is the host and port a PostgreSQL connection string names.
func pgHostPort(dsn string) (string, string) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "127.0.0.1", "5432"
	}
	return cfg.Host, strconv.Itoa(int(cfg.Port))
}

func ping(db *sql.DB) (*sql.DB, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// configurePool lets every handler goroutine hold a connection, and keeps
// them: a pool that closes idle connections would measure reconnects.
func configurePool(db *sql.DB, conc []int) {
	m := slices.Max(conc) + 4
	db.SetMaxOpenConns(m)
	db.SetMaxIdleConns(m)
}

// commaSet is the set of the comma-separated names in list, each trimmed
// and put through norm; nil for an empty list (no filter).
func commaSet(list string, norm func(string) string) map[string]bool {
	if list == "" {
		return nil
	}
	set := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		set[norm(strings.TrimSpace(s))] = true
	}
	return set
}

func runComparison(ctx context.Context, o options, w io.Writer) error {
	want := func(id string) bool { return o.only == nil || o.only[id] }
	fmt.Fprintf(w, "bench: %d messages per run, concurrency %v, median of %d runs, GOMAXPROCS %d, %d CPUs, load average %s\n",
		o.n, o.concurrency, o.repeat, runtime.GOMAXPROCS(0), runtime.NumCPU(), proc.LoadAverage())
	if o.rtt > 0 {
		fmt.Fprintf(w, "bench: -rtt %s added to every round trip to PostgreSQL, MariaDB and Redis (SQLite runs in process: none)\n", o.rtt)
	}

	pgDSN := testenv.PostgresDSN()
	pgRT := &roundTrips{rtt: o.rtt}
	pgConn, err := openPostgres(pgDSN, pgRT)
	if err != nil {
		return fmt.Errorf("PostgreSQL (%s=%s) is required: %w", testenv.PostgresEnv, pgDSN, err)
	}
	defer pgConn.Close()
	configurePool(pgConn, o.concurrency)
	pg := postgresDB(pgConn, pgRT)
	pgxRT := &roundTrips{rtt: o.rtt}
	pool, err := openPgxPool(ctx, pgDSN, slices.Max(o.concurrency)+4, pgxRT)
	if err != nil {
		return fmt.Errorf("PostgreSQL through pgxpool (%s=%s): %w", testenv.PostgresEnv, pgDSN, err)
	}
	defer pool.Close()
	px := &pgxDB{pg: pg, pool: pool, rt: pgxRT}

	var notes []string
	var my *database
	var myRT *roundTrips
	if want("E") {
		myRT = &roundTrips{rtt: o.rtt}
		if db, err := openMySQL(testenv.MySQLDSN(), myRT); err != nil {
			notes = append(notes, fmt.Sprintf("MariaDB skipped (%s=%s): %v", testenv.MySQLEnv, testenv.MySQLDSN(), err))
		} else {
			defer db.Close()
			configurePool(db, o.concurrency)
			my = mysqlDB(db, myRT)
		}
	}
	var lite *database
	if want("E") {
		db, closeDB, err := openSQLite()
		if err != nil {
			return err
		}
		defer closeDB()
		configurePool(db, o.concurrency)
		lite = sqliteDB(db)
	}
	var rdb *goredis.Client
	var redisRT *roundTrips
	if want("E") {
		redisRT = &roundTrips{rtt: o.rtt}
		rdb = goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(), PoolSize: slices.Max(o.concurrency) + 4, Dialer: redisRT.dial})
		defer rdb.Close()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := rdb.Ping(pctx).Err(); err != nil {
			notes = append(notes, fmt.Sprintf("Redis skipped (%s=%s): %v", testenv.RedisEnv, testenv.RedisAddr(), err))
			rdb = nil
		}
		cancel()
	}
	pgbench, pgbenchDSN := "", pgDSN
	var pgbenchRT *roundTrips
	if want("F") {
		if _, err := os.Stat(o.pgbench); err != nil {
			notes = append(notes, fmt.Sprintf("F skipped: pgbench not found at %s", o.pgbench))
		} else {
			pgbench = o.pgbench
		}
	}
	if pgbench != "" && o.rtt > 0 {
		// pgbench dials PostgreSQL itself: it goes through a proxy that
		// counts and delays its round trips like the harness's own.
		pgbenchRT = &roundTrips{rtt: o.rtt}
		proxy, err := startProxy(pgbenchRT, net.JoinHostPort(pgHostPort(pgDSN)))
		if err != nil {
			return err
		}
		defer proxy.close()
		if pgbenchDSN, err = dsnWithAddr(pgDSN, proxy.addr()); err != nil {
			return err
		}
		notes = append(notes, "F: pgbench connects through a proxy that adds -rtt per round trip, and a loopback hop of its own")
	}

	var dupBoth = map[int]result{}
	var dupErr = map[int]error{}
	var wPub = map[int]result{}
	var wErr = map[int]error{}
	wsql := func(c, batchSize int) (result, error) {
		consume, withPublish, err := scenarioWatermillSQL(ctx, pg, o.n, c, batchSize)
		if batchSize == 0 {
			wPub[c], wErr[c] = withPublish, err
		}
		return consume, err
	}
	// G runs right after B on each driver: G ÷ B (target ≥ 0.95) then
	// compares runs seconds apart, not B's with a G that follows W's and
	// D's writes (at c = 1, where G runs B's code, two runs each gave
	// G ÷ B 0.59–1.26 with W and D between them, 0.97–1.00 without).
	scenarios := []scenario{
		{"A", "A bare handler", "postgres", func(c int) (result, error) { return scenarioBare(ctx, pg, o.n, c) }},
		{"B", "B inbox", "postgres", func(c int) (result, error) { return scenarioInbox(ctx, pg, o.n, c) }},
		{"G", "G inbox, group commit", "postgres", func(c int) (result, error) { return scenarioInbox(ctx, pg, o.n, c, groupCommit(o, c)) }},
		{"C", "C duplicates (2nd pass)", "postgres", func(c int) (result, error) {
			dup, both, err := scenarioDuplicates(ctx, pg, o.n, c)
			dupBoth[c], dupErr[c] = both, err
			return dup, err
		}},
		{"C", "C both passes", "postgres", func(c int) (result, error) { return dupBoth[c], dupErr[c] }},
		{"A", "A bare handler", "pgx", func(c int) (result, error) { return scenarioBarePgx(ctx, px, o.n, c) }},
		{"B", "B inbox", "pgx", func(c int) (result, error) { return scenarioInboxPgx(ctx, px, o.n, c) }},
		{"G", "G inbox, group commit", "pgx", func(c int) (result, error) { return scenarioInboxPgx(ctx, px, o.n, c, groupCommit(o, c)) }},
		{"C", "C duplicates (2nd pass)", "pgx", func(c int) (result, error) { return scenarioDuplicatesPgx(ctx, px, o.n, c) }},
		{"N", "B inbox, no adaptive read", "postgres", func(c int) (result, error) { return scenarioInbox(ctx, pg, o.n, c, noAdaptiveRead) }},
		{"N", "C duplicates, no adaptive read", "postgres", func(c int) (result, error) {
			dup, _, err := scenarioDuplicates(ctx, pg, o.n, c, noAdaptiveRead)
			return dup, err
		}},
		{"N", "B inbox, no adaptive read", "pgx", func(c int) (result, error) { return scenarioInboxPgx(ctx, px, o.n, c, noAdaptiveRead) }},
		{"N", "C duplicates, no adaptive read", "pgx", func(c int) (result, error) {
			return scenarioDuplicatesPgx(ctx, px, o.n, c, noAdaptiveRead)
		}},
		{"R", "B inbox, ReadFirst", "postgres", func(c int) (result, error) { return scenarioInbox(ctx, pg, o.n, c, readFirst) }},
		{"R", "B inbox, ReadFirst", "pgx", func(c int) (result, error) { return scenarioInboxPgx(ctx, px, o.n, c, readFirst) }},
		{"R", "C duplicates, ReadFirst", "postgres", func(c int) (result, error) {
			dup, _, err := scenarioDuplicates(ctx, pg, o.n, c, readFirst)
			return dup, err
		}},
		{"W", "W watermill-sql (batch 100)", "postgres", func(c int) (result, error) { return wsql(c, 0) }},
		{"W", "W watermill-sql (batch 100) incl. publish", "postgres", func(c int) (result, error) { return wPub[c], wErr[c] }},
		{"W", "W1 watermill-sql (batch 1)", "postgres", func(c int) (result, error) { return wsql(c, 1) }},
		{"D", "D Deduplicator (memory)", "postgres", func(c int) (result, error) { return scenarioDeduplicator(ctx, pg, o.n, c) }},
	}
	if o.poolC > 0 && want("P") {
		// P: the same deliveries over a pool of o.pool connections, fewer
		// than the deliveries in flight: where group commit should win.
		poolRT := &roundTrips{rtt: o.rtt}
		conn, err := openPostgres(pgDSN, poolRT)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetMaxOpenConns(o.pool)
		conn.SetMaxIdleConns(o.pool)
		limited := postgresDB(conn, poolRT)
		scenarios = append(scenarios,
			scenario{"P", poolLabel("A bare handler"), "postgres", func(c int) (result, error) { return scenarioBare(ctx, limited, o.poolN, c) }},
			scenario{"P", poolLabel("B inbox"), "postgres", func(c int) (result, error) { return scenarioInbox(ctx, limited, o.poolN, c) }},
			scenario{"P", poolLabel("G inbox, group commit"), "postgres", func(c int) (result, error) {
				return scenarioInbox(ctx, limited, o.poolN, c, poolGroupCommit(o, c))
			}},
			scenario{"P", poolLabel(gAdaptive), "postgres", func(c int) (result, error) {
				return scenarioInbox(ctx, limited, o.poolN, c, groupCommit(o, c))
			}})
		notes = append(notes, fmt.Sprintf("P: %d deliveries in flight over a pool of %d connections (A, B and G on database/sql), %d messages per run; G as BatchConfig's docs advise for p < c (MaxMessages c/p = %d, Fixed), and G adaptive from MaxMessages %d",
			o.poolC, o.pool, o.poolN, poolBatchSize(o, o.poolC), batchSize(o, o.poolC)))
	}
	if lite != nil {
		scenarios = append(scenarios,
			scenario{"E", "E bare handler", "sqlite", func(c int) (result, error) { return scenarioBare(ctx, lite, o.n, c) }},
			scenario{"E", "E inbox", "sqlite", func(c int) (result, error) { return scenarioInbox(ctx, lite, o.n, c) }},
			scenario{"G", "G inbox, group commit", "sqlite", func(c int) (result, error) { return scenarioInbox(ctx, lite, o.n, c, groupCommit(o, c)) }})
	}
	if my != nil {
		scenarios = append(scenarios,
			scenario{"E", "E bare handler", "mariadb", func(c int) (result, error) { return scenarioBare(ctx, my, o.n, c) }},
			scenario{"E", "E inbox", "mariadb", func(c int) (result, error) { return scenarioInbox(ctx, my, o.n, c) }},
			scenario{"G", "G inbox, group commit", "mariadb", func(c int) (result, error) { return scenarioInbox(ctx, my, o.n, c, groupCommit(o, c)) }},
			scenario{"E", "E duplicates (2nd pass)", "mariadb", func(c int) (result, error) {
				dup, _, err := scenarioDuplicates(ctx, my, o.n, c)
				return dup, err
			}},
			scenario{"N", "C duplicates, no adaptive read", "mariadb", func(c int) (result, error) {
				dup, _, err := scenarioDuplicates(ctx, my, o.n, c, noAdaptiveRead)
				return dup, err
			}},
			scenario{"R", "B inbox, ReadFirst", "mariadb", func(c int) (result, error) { return scenarioInbox(ctx, my, o.n, c, readFirst) }})
	}
	if rdb != nil {
		scenarios = append(scenarios,
			scenario{"E", "E two-phase inbox", "redis+pg", func(c int) (result, error) { return scenarioRedisTwoPhase(ctx, pg, rdb, o.n, c) }})
	}
	if want("M") {
		brs, brNotes := availableBrokers(ctx)
		notes = append(notes, brNotes...)
		for _, br := range brs {
			scenarios = append(scenarios,
				scenario{"M", "M bare handler", br.name, func(c int) (result, error) { return scenarioBroker(ctx, pg, br, o.n, c, false) }},
				scenario{"M", "M inbox", br.name, func(c int) (result, error) { return scenarioBroker(ctx, pg, br, o.n, c, true) }},
				scenario{"M", "M inbox, group commit", br.name, func(c int) (result, error) {
					return scenarioBroker(ctx, pg, br, o.n, c, true, groupCommit(o, c))
				}})
		}
	}
	runPgbench := func(c, kind int) (result, error) {
		return countRoundTrips(pgbenchRT, func() (result, error) {
			return scenarioPgbench(ctx, pgbench, pgbenchDSN, pg, o.n, c, kind, batchSize(o, c))
		})
	}
	if pgbench != "" {
		scenarios = append(scenarios,
			scenario{"F", fInsert, "postgres", func(c int) (result, error) { return runPgbench(c, pgbenchInsert) }},
			scenario{"F", fBare, "postgres", func(c int) (result, error) { return runPgbench(c, pgbenchBare) }},
			scenario{"F", fInbox, "postgres", func(c int) (result, error) { return runPgbench(c, pgbenchInbox) }},
			scenario{"F", fGroup, "postgres", func(c int) (result, error) { return runPgbench(c, pgbenchGroup) }},
			scenario{"F", fGroupPipe, "postgres", func(c int) (result, error) { return runPgbench(c, pgbenchGroupPipelined) }})
	}
	scenarios = append(scenarios, scenario{"F", fGroupGo, "pgx", func(c int) (result, error) {
		return scenarioGoGroup(ctx, px, o.n, c, batchSize(o, c))
	}}, scenario{"F", fGroupRouter, "pgx", func(c int) (result, error) {
		return scenarioRouterGroup(ctx, px, o.n, c, batchSize(o, c), o.batchWait)
	}})

	ratios := slices.Concat(baseRatios, batchRatios, brokerRatios)
	concurrency := slices.Clone(o.concurrency)
	if o.poolC > 0 && want("P") && !slices.Contains(concurrency, o.poolC) {
		concurrency = append(concurrency, o.poolC)
	}

	// Repetition, then concurrency, are the outer loops, so a change of
	// background load during the run affects every scenario rather than
	// one; each cell keeps the run with the median throughput.
	runs := map[cell][]row{}
	start := time.Now()
	for rep := range o.repeat {
		for _, c := range concurrency {
			for _, s := range scenarios {
				// P runs at -pool-c alone, the others at every -c; -backends
				// leaves the others out.
				if !want(s.id) || (o.backends != nil && !o.backends[s.backend]) ||
					(s.id == "P" && c != o.poolC) || (s.id != "P" && !slices.Contains(o.concurrency, c)) {
					continue
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				r, err := s.run(c)
				k := cell{s.label, s.backend, c}
				runs[k] = append(runs[k], row{id: s.id, label: s.label, backend: s.backend, c: c, r: r, err: err})
				status := "ok"
				if err != nil {
					status = "FAILED: " + err.Error()
				}
				fmt.Fprintf(os.Stderr, "  run %d  %-30s %-9s c=%-3d %8.0f msgs/s  %s\n", rep+1, s.label, s.backend, c, safeRate(r), status)
			}
		}
	}
	var rows []row
	for _, rs := range runs {
		rows = append(rows, median(rs))
	}
	took := time.Since(start)

	slices.SortStableFunc(rows, func(a, b row) int {
		ia := slices.IndexFunc(scenarios, func(s scenario) bool { return s.label == a.label && s.backend == a.backend })
		ib := slices.IndexFunc(scenarios, func(s scenario) bool { return s.label == b.label && s.backend == b.backend })
		if ia != ib {
			return ia - ib
		}
		return a.c - b.c
	})
	printTable(w, rows)
	printRatios(w, runs, concurrency, ratios)
	printBatchLatency(w, rows, o.concurrency, o.batchWait)
	printBrokerSplit(w, rows)
	fmt.Fprintf(w, "\npeak RSS (getrusage maxrss) of the bench process: %.1f MiB\n", mib(peakRSS()))
	fmt.Fprintf(w, "took %s; load average at the end %s\n", took.Round(time.Second), proc.LoadAverage())
	if o.rtt > 0 {
		fmt.Fprintf(w, "-rtt %s: mean delay a round trip actually got: %s\n", o.rtt, meanDelays(map[string]*roundTrips{
			"postgres": pgRT, "pgx": pgxRT, "mariadb": myRT, "redis": redisRT, "pgbench": pgbenchRT}))
	}
	for _, n := range notes {
		fmt.Fprintln(w, "note:", n)
	}
	var failed []error
	for _, r := range rows {
		if r.err != nil {
			failed = append(failed, fmt.Errorf("%s %s c=%d: %w", r.label, r.backend, r.c, r.err))
		}
	}
	return errors.Join(failed...)
}

// median returns the run with the median throughput, or the first failed
// run if any failed.
func median(rs []row) row {
	for _, r := range rs {
		if r.err != nil {
			return r
		}
	}
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b row) int { return cmpFloat(a.r.rate(), b.r.rate()) })
	return s[len(s)/2]
}

// pairedRatio is the median of num's throughput over den's in each
// repetition where both ran without error (runs in repetition order); 0
// where none did. With an even count it is the mean of the middle two.
func pairedRatio(num, den []row) float64 {
	var rs []float64
	for i := range min(len(num), len(den)) {
		n, d := num[i], den[i]
		if n.err != nil || d.err != nil || safeRate(n.r) == 0 || safeRate(d.r) == 0 {
			continue
		}
		rs = append(rs, n.r.rate()/d.r.rate())
	}
	if len(rs) == 0 {
		return 0
	}
	slices.Sort(rs)
	m := len(rs) / 2
	if len(rs)%2 == 0 {
		return (rs[m-1] + rs[m]) / 2
	}
	return rs[m]
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func safeRate(r result) float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return r.rate()
}

func printTable(w io.Writer, rows []row) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tbackend\tconc\tmsgs/s\tp50\tp99\trt/msg\t")
	for _, r := range rows {
		if r.err != nil {
			fmt.Fprintf(tw, "%s\t%s\t%d\tfailed\t\t\t\t\n", r.label, r.backend, r.c)
			continue
		}
		rt := "-"
		if r.r.roundTrips > 0 {
			rt = fmt.Sprintf("%.2f", float64(r.r.roundTrips)/float64(r.r.n))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t\n", r.label, r.backend, r.c, r.r.rate(),
			fmtDur(stats.Percentile(r.r.latencies, 50)), fmtDur(stats.Percentile(r.r.latencies, 99)), rt)
	}
	_ = tw.Flush()
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
	}
}

// printRatios prints the throughput ratios the targets are stated in,
// each cell with the same ratio of the SQL alone (pgbench replaying each
// side's statements) in parentheses where the line has one: the bound
// the statements allow before any Go runs.
//
// A cell is the median over the repetitions of the ratio within one
// (pairedRatio): both sides ran minutes apart at most, while the
// machine's throughput moves by up to 2× from one repetition to the
// next, so a ratio of the table's medians, taken from different
// repetitions, can say 0.81 where the three pairs say 0.81, 1.16 and
// 1.00 (G ÷ B at c = 1, where G runs B's code).
func printRatios(w io.Writer, runs map[cell][]row, conc []int, ratios []ratio) {
	ratioAt := func(num, numBackend, den, denBackend string, c int) float64 {
		return pairedRatio(runs[cell{num, numBackend, c}], runs[cell{den, denBackend, c}])
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ratio (SQL bound: the same ratio of pgbench replaying each side's statements; each cell the median of the ratios within a repetition)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "ratio\ttarget")
	for _, c := range conc {
		fmt.Fprintf(tw, "\tc=%d", c)
	}
	fmt.Fprintln(tw)
	for _, q := range ratios {
		var cells []string
		any := false
		for _, c := range conc {
			r := ratioAt(q.num, q.numBackend, q.den, q.denBackend, c)
			if r == 0 {
				cells = append(cells, "-")
				continue
			}
			any = true
			text := fmt.Sprintf("%.2f", r)
			if q.boundNum != "" {
				if b := ratioAt(q.boundNum, "postgres", q.boundDen, "postgres", c); b > 0 {
					text += fmt.Sprintf(" (%.2f)", b)
				}
			}
			cells = append(cells, text)
		}
		if !any {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", q.name, q.target, strings.Join(cells, "\t"))
	}
	_ = tw.Flush()
}
