package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/watermill-idempotent/cmd/idemctl/internal/dsn"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
	mysqlrepo "github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	redisrepo "github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// kind is the store a DSN names.
type kind string

const (
	kindPostgres kind = "postgres"
	kindMySQL    kind = "mysql"
	kindSQLite   kind = "sqlite"
	kindRedis    kind = "redis"
)

// usageError marks errors in what the user asked for (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// store is an open connection to the inbox (and, on PostgreSQL and
// MySQL, the outbox) a command works on.
type store struct {
	kind   kind
	db     *sql.DB                 // nil on Redis
	redis  goredis.UniversalClient // nil on SQL
	repo   any                     // the backend's repository
	table  string                  // inbox table (SQL)
	outbox outbox.Config           // on PostgreSQL and MySQL
	// partitioned: the inbox is postgres.PartitionedRepository (--layout).
	partitioned                bool
	outboxTable, versionsTable string
}

func (s *store) Close() error {
	if s.db != nil {
		return s.db.Close()
	}
	if s.redis != nil {
		return s.redis.Close()
	}
	return nil
}

// open connects to what g names: --dsn (PostgreSQL, MySQL, SQLite) or
// --redis. It never puts the DSN itself into an error.
func open(ctx context.Context, g *Globals) (*store, error) {
	switch {
	case g.DSN != "" && g.Redis != "":
		return nil, usagef("give --dsn or --redis, not both")
	case g.Redis != "":
		return openRedis(ctx, g)
	case g.DSN != "":
		return openSQL(ctx, g)
	}
	return nil, usagef("no store given: pass --dsn (or set IDEMCTL_DSN) or --redis (IDEMCTL_REDIS)")
}

func openRedis(ctx context.Context, g *Globals) (*store, error) {
	if g.Layout == layoutPartitioned {
		return nil, usagef("--layout partitioned is PostgreSQL's (postgres.NewPartitionedRepository); redis has one layout")
	}
	// go-redis's errors can quote the URL (net/url's do); run's scrubber
	// masks the password in them.
	opts, err := goredis.ParseURL(g.Redis)
	if err != nil {
		return nil, usagef("--redis %s: %v (want redis://[user:password@]host:port/db)", dsn.Redact(g.Redis), err)
	}
	client := goredis.NewClient(opts)
	pingCtx, cancel := context.WithTimeout(ctx, g.ConnectTimeout)
	defer cancel()
	if err := client.Ping(pingCtx).Err(); err != nil {
		_ = client.Close()
		return nil, redisConnectError(ctx, "redis "+dsn.Redact(g.Redis), opts, g.ConnectTimeout, err)
	}
	repo, err := redisrepo.NewRepository(client, redisrepo.Config{KeyPrefix: g.RedisPrefix})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &store{kind: kindRedis, redis: client, repo: repo}, nil
}

func openSQL(ctx context.Context, g *Globals) (*store, error) {
	var (
		k          kind
		driver     string
		driverDSN  string
		sqlitePath string
		mysqlAddr  string // host:port, for errors
	)
	switch s := g.DSN; {
	case strings.HasPrefix(s, "postgres://"), strings.HasPrefix(s, "postgresql://"), pgKeywordValue.MatchString(s):
		// What pgconn's parse errors say is masked on a best-effort basis;
		// run's scrubber masks what they miss.
		if _, err := pgconn.ParseConfig(s); err != nil {
			if cause := errors.Unwrap(err); cause != nil {
				err = cause // without pgconn's copy of the DSN
			}
			return nil, usagef("--dsn %s is not a valid PostgreSQL URL or keyword/value string: %v", dsn.Redact(s), err)
		}
		k, driver, driverDSN = kindPostgres, "pgx", s
	case strings.HasPrefix(s, "mysql://"):
		u, err := url.Parse(s)
		if err != nil {
			return nil, usagef("--dsn is not a valid mysql:// URL")
		}
		cfg, err := mysqlConfig(u)
		if err != nil {
			return nil, err
		}
		k, driver, driverDSN, mysqlAddr = kindMySQL, "mysql", cfg.FormatDSN(), cfg.Addr
	case strings.HasPrefix(s, "sqlite://"):
		k, sqlitePath = kindSQLite, strings.TrimPrefix(s, "sqlite://")
	case strings.HasPrefix(s, "file:"):
		k, sqlitePath = kindSQLite, strings.TrimPrefix(s, "file:")
	case mysqlDriverDSN.MatchString(s):
		cfg, err := mysql.ParseDSN(s)
		if err != nil {
			return nil, usagef("--dsn %s is not a valid MySQL DSN: %v", dsn.Redact(s), err)
		}
		if err := mysqlDefaults(cfg); err != nil {
			return nil, err
		}
		k, driver, driverDSN, mysqlAddr = kindMySQL, "mysql", cfg.FormatDSN(), cfg.Addr
	default:
		return nil, usagef("--dsn must start with postgres://, postgresql://, mysql://, sqlite:// or file:, or be a PostgreSQL keyword/value string (host=… dbname=…) or a MySQL DSN (user:pass@tcp(host:3306)/db)")
	}
	if g.Layout == layoutPartitioned && k != kindPostgres {
		return nil, usagef("--layout partitioned is PostgreSQL's (postgres.NewPartitionedRepository); %s has one layout", k)
	}
	var db *sql.DB
	if k == kindSQLite {
		if i := strings.IndexByte(sqlitePath, '?'); i >= 0 {
			sqlitePath = sqlitePath[:i]
		}
		if sqlitePath == "" {
			return nil, usagef("--dsn names no SQLite file")
		}
		if _, err := os.Stat(sqlitePath); err != nil && !g.createSQLite {
			return nil, fmt.Errorf("sqlite: %w (run idemctl migrate up to create it)", err)
		}
		var err error
		if db, err = sqlite.Open(sqlitePath); err != nil {
			return nil, err
		}
	} else {
		var err error
		if db, err = sql.Open(driver, driverDSN); err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		pingCtx, cancel := context.WithTimeout(ctx, g.ConnectTimeout)
		defer cancel()
		if err := db.PingContext(pingCtx); err != nil {
			_ = db.Close()
			what := fmt.Sprintf("%s database %s", k, dsn.Redact(g.DSN))
			if k == kindPostgres {
				return nil, postgresConnectError(what, err)
			}
			return nil, mysqlConnectError(what, mysqlAddr, err)
		}
	}
	s := &store{kind: k, db: db, table: g.Table, outboxTable: g.OutboxTable, versionsTable: g.VersionsTable}
	var err error
	switch {
	case k == kindPostgres && g.Layout == layoutPartitioned:
		s.partitioned = true
		s.repo, err = postgres.NewPartitionedRepository(db, postgres.PartitionedConfig{Table: g.Table, Interval: g.PartitionInterval, Ahead: g.PartitionAhead})
		s.outbox = outbox.Config{Dialect: sqldialect.PostgreSQL, Table: g.OutboxTable}
	case k == kindPostgres:
		s.repo, err = postgres.NewRepository(db, postgres.Config{Table: g.Table})
		s.outbox = outbox.Config{Dialect: sqldialect.PostgreSQL, Table: g.OutboxTable}
	case k == kindMySQL:
		s.repo, err = mysqlrepo.NewRepository(db, mysqlrepo.Config{Table: g.Table})
		s.outbox = outbox.Config{Dialect: sqldialect.MySQL, Table: g.OutboxTable}
	case k == kindSQLite:
		s.repo, err = sqlite.NewRepository(db, sqlite.Config{Table: g.Table})
	}
	if err != nil {
		_ = db.Close()
		return nil, usagef("%v", err)
	}
	if err := s.checkLayout(ctx, g); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// checkLayout refuses a PostgreSQL inbox table whose layout is not the
// one --layout names: the plain repository would purge a partitioned
// table row by row, the partitioned one cannot create partitions of a
// plain table. A table that does not exist yet passes.
func (s *store) checkLayout(ctx context.Context, g *Globals) error {
	if g.Layout == layoutPlain && (g.PartitionInterval != 0 || g.PartitionAhead != 0) {
		return usagef("--partition-interval and --partition-ahead go with --layout partitioned")
	}
	if s.kind != kindPostgres {
		return nil
	}
	quoted, err := repository.QuoteTableName(s.table, `"`)
	if err != nil {
		return usagef("%v", err)
	}
	var relkind sql.NullString
	if err := s.db.QueryRowContext(ctx, `SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`, quoted).Scan(&relkind); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return fmt.Errorf("reading the layout of %s: %w", s.table, err)
	}
	switch partitioned := relkind.String == "p"; {
	case partitioned && !s.partitioned:
		return usagef("inbox table %s is partitioned (postgres.NewPartitionedRepository): pass --layout partitioned", s.table)
	case !partitioned && s.partitioned:
		return usagef("inbox table %s is not partitioned: drop --layout partitioned (it is the plain postgres.NewRepository layout)", s.table)
	}
	return nil
}

// The --dsn forms that name no scheme: PostgreSQL's keyword/value
// string and go-sql-driver/mysql's own DSN.
var (
	pgKeywordValue = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)
	mysqlDriverDSN = regexp.MustCompile(`^[^/]*@[a-z]*(\(.*\))?/`)
)

// mysqlConfig turns mysql://user:pass@host:port/db?params into the
// driver's configuration, with the settings the MySQL backend expects.
// The password may be given as ?password= too; it is never passed on as
// a session variable (the driver would run SET password=…, and the
// server's error would quote it).
func mysqlConfig(u *url.URL) (*mysql.Config, error) {
	cfg := mysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = u.Hostname() + ":3306"
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	for k, v := range u.Query() {
		if k == "password" {
			if cfg.Passwd != "" {
				return nil, usagef("the mysql:// DSN gives a password twice (user:password@ and ?password=)")
			}
			cfg.Passwd = v[0]
			continue
		}
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		cfg.Params[k] = v[0]
	}
	return cfg, mysqlDefaults(cfg)
}

// mysqlDefaults sets what the MySQL backend expects of a connection.
func mysqlDefaults(cfg *mysql.Config) error {
	if cfg.DBName == "" {
		return usagef("the MySQL DSN names no database (mysql://user@host:3306/db)")
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	return nil
}

// The capabilities commands need, with errors naming what is missing.

func (s *store) stats() (repository.Stats, error) {
	if st, ok := s.repo.(repository.Stats); ok {
		return st, nil
	}
	return nil, fmt.Errorf("%s does not count records", s.kind)
}

func (s *store) operator() (repository.Operator, error) {
	if op, ok := s.repo.(repository.Operator); ok {
		return op, nil
	}
	return nil, fmt.Errorf("%s has no operator API", s.kind)
}

func (s *store) cleaner() (repository.Cleaner, error) {
	if c, ok := s.repo.(repository.Cleaner); ok {
		return c, nil
	}
	return nil, fmt.Errorf("%s cannot delete expired records", s.kind)
}

func (s *store) deadLetters() (*outbox.DeadLetters, error) {
	if s.outbox.Dialect == "" {
		return nil, usagef("the outbox lives in PostgreSQL or MySQL; %s has none", s.kind)
	}
	return outbox.NewDeadLetters(s.db, s.outbox)
}

// refusingPublisher lets idemctl build a Relay to read its Backlog; the
// relay is never run, so nothing is published.
type refusingPublisher struct{}

func (refusingPublisher) Publish(string, ...*message.Message) error {
	return errors.New("idemctl does not publish")
}
func (refusingPublisher) Close() error { return nil }

func (s *store) backlog(ctx context.Context) (outbox.Backlog, error) {
	r, err := outbox.NewRelay(s.db, refusingPublisher{}, outbox.RelayConfig{Dialect: s.outbox.Dialect, Table: s.outbox.Table})
	if err != nil {
		return outbox.Backlog{}, err
	}
	return r.Backlog(ctx)
}

// knownConsumers returns the consumers with live records.
func (s *store) knownConsumers(ctx context.Context) ([]string, error) {
	st, err := s.stats()
	if err != nil {
		return nil, err
	}
	counts, err := st.CountRecords(ctx, time.Now())
	if err != nil {
		return nil, err
	}
	names := make([]string, len(counts))
	for i, c := range counts {
		names[i] = c.Consumer
	}
	return names, nil
}

// checkConsumer fails with a clear message when consumer has no live
// records in the store.
func (s *store) checkConsumer(ctx context.Context, consumer string) error {
	if consumer == "" {
		return nil
	}
	names, err := s.knownConsumers(ctx)
	if err != nil {
		return err
	}
	return knownConsumer(consumer, names, "live records")
}

// knownConsumer fails with a clear message when consumer is not in names,
// the consumers that have records (which: "live records", "records").
func knownConsumer(consumer string, names []string, which string) error {
	if slices.Contains(names, consumer) {
		return nil
	}
	known := "none"
	if len(names) > 0 {
		known = strings.Join(names, ", ")
	}
	return usagef("unknown consumer %q: the store has no %s for it (consumers with %s: %s)", consumer, which, which, known)
}

// isMissingTable reports an error for a table that does not exist
// (PostgreSQL 42P01, MySQL 1146, SQLite "no such table").
func isMissingTable(err error) bool {
	if sqldialect.SQLState(err) == "42P01" {
		return true
	}
	var my *mysql.MySQLError
	if errors.As(err, &my) && my.Number == 1146 {
		return true
	}
	return strings.Contains(err.Error(), "no such table")
}

// countExpired counts the records a purge would delete, for its progress.
func (s *store) countExpired(ctx context.Context, before time.Time) (int, error) {
	by, err := s.expiredByConsumer(ctx, before)
	total := 0
	for _, n := range by {
		total += n
	}
	return total, err
}

// expiredByConsumer counts the records that expired before before, the
// ones purge deletes, per consumer.
func (s *store) expiredByConsumer(ctx context.Context, before time.Time) (map[string]int, error) {
	quote := `"`
	var arg any = before
	switch s.kind {
	case kindMySQL:
		quote, arg = "`", before.UTC().Format("2006-01-02 15:04:05.999999")
	case kindSQLite:
		arg = before.UnixMicro()
	}
	q, err := repository.QuoteTableName(s.table, quote)
	if err != nil {
		return nil, usagef("%v", err)
	}
	ph := "?"
	if s.kind == kindPostgres {
		ph = "$1"
	}
	rows, err := s.db.QueryContext(ctx, "SELECT consumer, COUNT(*) FROM "+q+" WHERE expires_at < "+ph+" GROUP BY consumer", arg)
	if err != nil {
		if isMissingTable(err) {
			return nil, usagef("table %s does not exist (wrong --table, or run idemctl migrate up)", s.table)
		}
		return nil, fmt.Errorf("counting expired records: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			consumer string
			n        int
		)
		if err := rows.Scan(&consumer, &n); err != nil {
			return nil, fmt.Errorf("counting expired records: %w", err)
		}
		out[consumer] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("counting expired records: %w", err)
	}
	return out, nil
}

// migrationLine is one table's numbered migrations: the files a package
// ships and the subject ("<line>:<table name>") under which
// repository.MigrationsTable records the applied ones.
type migrationLine struct {
	label string // what the table is, for output: inbox, outbox, versions
	line  string // the subject's prefix and, for the stores, the folder
	table string
	fsys  fs.FS
	dir   string
	// up applies the pending migrations and returns those it applied.
	up func(context.Context) ([]repository.Migration, error)
}

// inboxLine is the inbox table's line: migrations/inbox, or on the
// partitioned layout migrations/partitioned_inbox.
func (s *store) inboxLine() (migrationLine, error) {
	l := migrationLine{label: "inbox", line: "inbox", table: s.table}
	switch s.kind {
	case kindPostgres:
		l.fsys = postgres.Migrations
	case kindMySQL:
		l.fsys = mysqlrepo.Migrations
	case kindSQLite:
		l.fsys = sqlite.Migrations
	}
	if s.partitioned {
		l.line = "partitioned_inbox"
	}
	l.dir = "migrations/" + l.line
	m, ok := s.repo.(interface {
		Migrations(context.Context) ([]repository.Migration, error)
	})
	if !ok {
		return l, fmt.Errorf("%s has no migrations", s.kind)
	}
	l.up = m.Migrations
	return l, nil
}

// outboxLine is the outbox table's line (outbox.Migrations); outbox.Migrate
// does not return what it applied, so up reads the difference.
func (s *store) outboxLine() (migrationLine, error) {
	cfg := s.outbox
	if s.kind == kindSQLite {
		cfg = outbox.Config{Dialect: sqldialect.SQLite, Table: s.outboxTable}
	}
	ob, err := outbox.New(cfg)
	if err != nil {
		return migrationLine{}, usagef("%v", err)
	}
	l := migrationLine{label: "outbox", line: "outbox", table: cfg.Table, fsys: outbox.Migrations, dir: "migrations/" + string(cfg.Dialect)}
	l.up = func(ctx context.Context) ([]repository.Migration, error) {
		before, err := s.appliedMigrations(ctx, l)
		if err != nil {
			return nil, err
		}
		if err := ob.Migrate(ctx, s.db); err != nil {
			return nil, err
		}
		return s.newlyApplied(ctx, l, before)
	}
	return l, nil
}

// versionsLine is the version guard's table's line (migrations/versions).
func (s *store) versionsLine() (migrationLine, error) {
	l := migrationLine{label: "versions", line: "versions", table: s.versionsTable, dir: "migrations/versions"}
	var (
		v interface {
			Migrations(context.Context) ([]repository.Migration, error)
		}
		err error
	)
	switch s.kind {
	case kindPostgres:
		l.fsys = postgres.Migrations
		v, err = postgres.NewVersionStore(s.db, postgres.VersionConfig{Table: s.versionsTable})
	case kindMySQL:
		l.fsys = mysqlrepo.Migrations
		v, err = mysqlrepo.NewVersionStore(s.db, mysqlrepo.VersionConfig{Table: s.versionsTable})
	case kindSQLite:
		l.fsys = sqlite.Migrations
		v, err = sqlite.NewVersionStore(s.db, sqlite.VersionConfig{Table: s.versionsTable})
	}
	if err != nil {
		return l, usagef("%v", err)
	}
	l.up = v.Migrations
	return l, nil
}

// newlyApplied returns the migrations of l recorded now but not in before.
func (s *store) newlyApplied(ctx context.Context, l migrationLine, before map[int]time.Time) ([]repository.Migration, error) {
	after, err := s.appliedMigrations(ctx, l)
	if err != nil {
		return nil, err
	}
	files, err := migrationFiles(l)
	if err != nil {
		return nil, err
	}
	var out []repository.Migration
	for _, f := range files {
		if _, was := before[f.Version]; !was {
			if _, is := after[f.Version]; is {
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// migrationFiles lists the migrations of l, in version order.
func migrationFiles(l migrationLine) ([]repository.Migration, error) {
	entries, err := fs.ReadDir(l.fsys, l.dir)
	if err != nil {
		return nil, err
	}
	var out []repository.Migration
	for _, e := range entries {
		m := migrationFile.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		out = append(out, repository.Migration{Version: v, Name: m[2]})
	}
	slices.SortFunc(out, func(a, b repository.Migration) int { return a.Version - b.Version })
	return out, nil
}

var migrationFile = regexp.MustCompile(`^(\d+)_(\w+)\.up\.sql$`)

// appliedMigrations reads the versions of l recorded for its table in
// repository.MigrationsTable (none when that table does not exist yet).
func (s *store) appliedMigrations(ctx context.Context, l migrationLine) (map[int]time.Time, error) {
	quote, ph := `"`, "?"
	switch s.kind {
	case kindMySQL:
		quote = "`"
	case kindPostgres:
		ph = "$1"
	}
	quoted, err := repository.QuoteTableName(l.table, quote)
	if err != nil {
		return nil, usagef("%v", err)
	}
	schema, name := "", l.table
	if i := strings.LastIndexByte(l.table, '.'); i >= 0 {
		schema, name = l.table[:i], l.table[i+1:]
	}
	// Records of a table dropped since are void: Migrate applies it afresh.
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+quoted+" WHERE 1 = 0").Scan(new(int)); err != nil {
		if isMissingTable(err) {
			return map[int]time.Time{}, nil
		}
		return nil, err
	}
	tbl := quote + repository.MigrationsTable + quote
	if schema != "" {
		tbl = quote + schema + quote + "." + tbl
	}
	rows, err := s.db.QueryContext(ctx, "SELECT version, applied_at FROM "+tbl+" WHERE subject = "+ph, l.line+":"+name)
	if err != nil {
		if isMissingTable(err) {
			return map[int]time.Time{}, nil
		}
		return nil, fmt.Errorf("reading applied migrations: %w", err)
	}
	defer rows.Close()
	out := map[int]time.Time{}
	for rows.Next() {
		var (
			v  int
			at any
		)
		if err := rows.Scan(&v, &at); err != nil {
			return nil, fmt.Errorf("reading applied migrations: %w", err)
		}
		out[v] = asTime(at)
	}
	return out, rows.Err()
}

// asTime reads a TIMESTAMP column whatever the driver returns for it.
func asTime(v any) time.Time {
	switch t := v.(type) {
	case time.Time:
		return t
	case string:
		for _, layout := range []string{"2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05", time.RFC3339Nano} {
			if p, err := time.Parse(layout, t); err == nil {
				return p
			}
		}
	case []byte:
		return asTime(string(t))
	}
	return time.Time{}
}
