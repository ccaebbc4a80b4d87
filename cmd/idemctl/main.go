// Command idemctl is the operator's tool for watermill-idempotent stores:
// record counts, stuck two-phase records, expired-record cleanup, the
// outbox relay's dead letters and schema migrations.
//
//	go install github.com/idemkit/watermill-idempotent/cmd/idemctl@latest
//	export IDEMCTL_DSN='postgres://app@db:5432/app'
//	idemctl stats
//	idemctl stuck list
//	idemctl stuck resolve --consumer billing --key order-7 --complete
//
// --dsn (or IDEMCTL_DSN) selects the store by scheme: postgres://,
// mysql://, sqlite:// or file:, or by form: a PostgreSQL keyword/value
// string, a go-sql-driver/mysql DSN; --redis (or IDEMCTL_REDIS) a Redis inbox;
// --layout partitioned the partitioned PostgreSQL inbox. migrate up and
// migrate status take --outbox and --versions for the outbox's and the
// version guard's tables.
// Secrets in DSNs are never printed, in any DSN form (internal/dsn).
// resolve, purge and requeue show what they will change and ask for
// confirmation; without a terminal they refuse unless --yes is given.
// Exit status: 0 on success, 1 on failure, 2 on a usage error, 3 from
// migrate status while a migration is pending (a deploy gate). See
// docs/operations.md.
//
// idemctl uses only the library's public packages, so it builds from a
// published version of the library (TestNoLibraryInternalImports).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/idemkit/watermill-idempotent/cmd/idemctl/internal/dsn"
	"github.com/idemkit/watermill-idempotent/outbox"
	"github.com/idemkit/watermill-idempotent/repository"
)

// Globals are the flags every command takes.
type Globals struct {
	DSN           string `help:"SQL store: postgres://…, host=… dbname=… (PostgreSQL), mysql://user:pass@host:3306/db, user:pass@tcp(host:3306)/db, sqlite:///path/to.db or file:path." env:"IDEMCTL_DSN" placeholder:"DSN"`
	Redis         string `help:"Redis store: redis://[[user]:password@]host:6379/0 or rediss://…." env:"IDEMCTL_REDIS" placeholder:"URL"`
	RedisPrefix   string `help:"Key prefix of the Redis inbox (default: the backend's)." placeholder:"PREFIX"`
	Table         string `help:"Inbox table." default:"${inbox_table}"`
	OutboxTable   string `help:"Outbox table." default:"${outbox_table}"`
	VersionsTable string `help:"Version guard's table (migrate --versions)." default:"${versions_table}"`
	Layout        string `help:"Inbox layout: plain, or partitioned (PostgreSQL: postgres.NewPartitionedRepository, see docs/partitioning.md)." enum:"plain,partitioned" default:"plain"`
	// The partitioned layout's settings must be the application's.
	PartitionInterval time.Duration `help:"With --layout partitioned: the application's PartitionedConfig.Interval (default: the library's, 24h)."`
	PartitionAhead    time.Duration `help:"With --layout partitioned: the application's PartitionedConfig.Ahead (default: the library's, 8 days)."`
	JSON              bool          `help:"Print JSON for scripts instead of tables (bytes, such as a dead letter's payload, base64-encoded under *_base64 keys)."`
	Yes               bool          `short:"y" help:"Do not ask for confirmation (required without a terminal)."`
	ConnectTimeout    time.Duration `help:"How long to wait for the store to answer." default:"10s"`

	stdout, stderr io.Writer
	stdin          *os.File
	createSQLite   bool // migrate up may create the SQLite file
}

// CLI is idemctl's command tree.
type CLI struct {
	Globals
	Version kong.VersionFlag `help:"Print idemctl's version and exit."`

	Stats       StatsCmd       `cmd:"" help:"Records per consumer and state; outbox backlog, oldest message age and dead letters."`
	Stuck       StuckCmd       `cmd:"" help:"Two-phase records whose lease expired mid-effect."`
	Purge       PurgeCmd       `cmd:"" help:"Delete expired records in batches, with progress."`
	Deadletters DeadlettersCmd `cmd:"" aliases:"dl" help:"Messages the outbox relay gave up on."`
	Migrate     MigrateCmd     `cmd:"" help:"Create or upgrade the inbox (and outbox, version guard) tables. There is no migrate down, on purpose: see migrate --help."`
}

// The inbox layouts of --layout.
const (
	layoutPlain       = "plain"
	layoutPartitioned = "partitioned"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit status.
func run(args []string, stdin *os.File, stdout, stderr io.Writer) int {
	// Everything idemctl prints, kong's messages included, goes through
	// the scrubber, which knows the secrets of every DSN given before
	// anything is parsed (a DSN can be echoed by a parse error).
	scrubber := dsnScrubber(args)
	stdout, stderr = scrubber.Writer(stdout), scrubber.Writer(stderr)
	var cli CLI
	cli.stdout, cli.stderr, cli.stdin = stdout, stderr, stdin
	exit := -1
	parser, err := kong.New(&cli,
		kong.Name("idemctl"),
		kong.Description("Operate watermill-idempotent stores: stats, stuck two-phase records, cleanup, outbox dead letters, migrations."),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Help(helpPrinter),
		kong.Vars{"inbox_table": repository.DefaultTableName, "outbox_table": outbox.DefaultTableName, "versions_table": repository.DefaultVersionsTableName,
			"version": version()},
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { exit = code }),
	)
	if err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		return 1
	}
	kctx, err := parser.Parse(args)
	if exit >= 0 { // --help, --version
		return exit
	}
	if err != nil {
		// Without a command (bare idemctl, idemctl stuck) the usage of
		// what was typed says what can follow.
		var perr *kong.ParseError
		if errors.As(err, &perr) && missingCommand(perr.Context) {
			_ = perr.Context.PrintUsage(false)
		}
		fmt.Fprintln(stderr, "idemctl:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(&cli.Globals); err != nil {
		fmt.Fprintln(stderr, "idemctl:", err)
		var status exitStatus
		switch {
		case errors.As(err, &status):
			return status.code
		case errors.As(err, new(usageError)):
			return 2
		}
		return 1
	}
	return 0
}

// exitPending is migrate status's exit status while a migration is
// pending: neither success (0) nor a failure to find out (1, 2), so a
// deploy gate can tell the three apart.
const exitPending = 3

// exitStatus is an error that sets the exit status: a command that ran
// and found a state the caller must act on (a pending migration).
type exitStatus struct {
	error
	code int
}

func (e exitStatus) Unwrap() error { return e.error }

// missingCommand reports whether ctx stops before a command: at the top
// or at a group such as stuck, which only its subcommands run.
func missingCommand(ctx *kong.Context) bool {
	if ctx == nil {
		return false
	}
	n := ctx.Selected()
	return n == nil || len(n.Children) > 0
}

// helpPrinter is kong's, except that a command's help lists its own
// flags and names the global ones (idemctl --help describes them) instead
// of repeating their descriptions under every command.
func helpPrinter(options kong.HelpOptions, ctx *kong.Context) error {
	if ctx.Selected() == nil {
		return kong.DefaultHelpPrinter(options, ctx)
	}
	line := "Global flags (idemctl --help describes them):"
	lines := []string{}
	for _, f := range ctx.Model.Flags {
		if f.Hidden || f.Name == "help" {
			continue
		}
		f.Hidden = true
		defer func() { f.Hidden = false }()
		if f.Name == "version" {
			continue
		}
		if len(line)+len(f.Name)+4 > 80 {
			lines = append(lines, line)
			line = " "
		}
		line += " --" + f.Name + ","
	}
	lines = append(lines, strings.TrimSuffix(line, ",")+".")
	if err := kong.DefaultHelpPrinter(options, ctx); err != nil {
		return err
	}
	_, err := fmt.Fprintf(ctx.Stdout, "\n%s\n", strings.Join(lines, "\n"))
	return err
}

// version is idemctl's module version from its build information:
// "(devel)" for a build from a source tree without one.
func version() string {
	v, goVersion := "(devel)", ""
	if info, ok := debug.ReadBuildInfo(); ok {
		if info.Main.Version != "" {
			v = info.Main.Version
		}
		goVersion = " " + info.GoVersion
	}
	return "idemctl " + v + goVersion
}

// dsnScrubber knows the secrets of the DSNs in IDEMCTL_DSN, IDEMCTL_REDIS
// and args: the values of --dsn and --redis, and any argument shaped like
// a URL (a DSN given without its flag).
func dsnScrubber(args []string) *dsn.Scrubber {
	var sc dsn.Scrubber
	sc.Add(os.Getenv("IDEMCTL_DSN"))
	sc.Add(os.Getenv("IDEMCTL_REDIS"))
	for i, a := range args {
		switch flag, value, hasValue := strings.Cut(a, "="); {
		case flag == "--dsn" || flag == "--redis":
			if hasValue {
				sc.Add(value)
			} else if i+1 < len(args) {
				sc.Add(args[i+1])
			}
		case strings.HasPrefix(a, "-") && strings.Contains(value, "://"):
			sc.Add(value) // --other-flag=DSN
		case strings.Contains(a, "://"):
			sc.Add(a)
		}
	}
	return &sc
}
