package middleware_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	msqlite "modernc.org/sqlite"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/middleware"
	"github.com/idemkit/watermill-idempotent/repository/postgres"
	"github.com/idemkit/watermill-idempotent/repository/sqlite"
)

// TestClaimPathIsShort follows a key from the middleware to the INSERT
// that claims it, by the call stack the driver sees when the INSERT
// arrives: the library files on that stack, from the router middleware
// down, in call order, on both Go drivers. A reader following the claim
// visits these files and no others; the test keeps the walk one-way and
// no longer than it is today: the middleware (inbox.go), the protocol
// every entry point shares (internal/protocol), the driver seam
// (internal/sqlstore/driver.go), then on database/sql the SQL store that
// sends the statement (internal/sqlstore/inbox.go) and the driver
// adapter (sqlexec), on pgx the batch that sends BEGIN with the claim
// (repository/postgres/pgx.go; the claim's text is the same statement,
// built by internal/sqlstore/inbox.go before the send).
//
// One return is allowed: the protocol begins the transaction through a
// callback of the middleware (inbox.go), which hands the claim to the
// driver, so inbox.go is on the stack twice, around internal/protocol.
//
//	go test -run TestClaimPathIsShort -v ./middleware/
func TestClaimPathIsShort(t *testing.T) {
	for _, c := range []struct {
		name string
		path func(*testing.T) []string
		// then are the files the claim reaches after the driver seam, in
		// order.
		then []string
	}{
		{"database/sql", claimPath, []string{"internal/sqlstore/inbox.go", "sqlexec/sqlexec.go"}},
		{"pgx", pgxClaimPath, []string{"repository/postgres/pgx.go"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := c.path(t)
			t.Logf("claim path, middleware to INSERT:\n  %s", strings.Join(path, "\n  "))
			var files []string
			for _, p := range path {
				f, _, _ := strings.Cut(p, ":")
				if len(files) == 0 || files[len(files)-1] != f {
					files = append(files, f)
				}
			}
			t.Logf("files: %v", files)
			seen := map[string]bool{}
			for k, f := range files {
				callback := k >= 2 && f == "middleware/inbox.go" && files[k-1] == "internal/protocol/transactional.go" && files[k-2] == f
				require.Falsef(t, seen[f] && !callback, "the claim returns to %s after leaving it: %v", f, files)
				seen[f] = true
			}
			require.LessOrEqualf(t, len(seen), maxClaimFiles, "the claim crosses %d files: %v", len(seen), files)
			want := append([]string{"middleware/inbox.go", "internal/protocol/transactional.go", "middleware/inbox.go", "internal/sqlstore/driver.go"}, c.then...)
			require.Equal(t, want, files, "the claim's way from the middleware to the driver")
		})
	}
}

// maxClaimFiles bounds the distinct files a claim crosses.
const maxClaimFiles = 5

// claimPath runs one delivery through the inbox on SQLite and returns
// the library frames (file:function) on the stack of the claim's INSERT,
// outermost first.
func claimPath(t *testing.T) []string {
	t.Helper()
	tr := &tracer{}
	name := "claimtrace-" + strings.ReplaceAll(t.Name(), "/", "-")
	sql.Register(name, tr)
	db, err := sql.Open(name, sqlite.DSN(filepath.Join(t.TempDir(), "trace.db")))
	require.NoError(t, err)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = db.Close() })
	repo, err := sqlite.NewRepository(db, sqlite.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "trace"})
	require.NoError(t, err)

	tr.arm()
	msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
	_, err = inbox.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	require.NoError(t, err)
	path := tr.path()
	require.NotEmpty(t, path, "no INSERT reached the driver")
	return path
}

// pgxClaimPath runs one delivery through the inbox on the pgx repository
// and returns the library frames on the stack of the claim's INSERT as
// pgx sends it, outermost first.
func pgxClaimPath(t *testing.T) []string {
	t.Helper()
	tr := &tracer{}
	cfg := testenv.PgxSchemaPool(t, "claimtrace_").Config()
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = pgxTracer{tr}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	repo, err := postgres.NewPgxRepository(pool, postgres.Config{})
	require.NoError(t, err)
	require.NoError(t, repo.Migrate(t.Context()))
	inbox, err := middleware.NewInbox(repo, middleware.Config{Consumer: "trace"})
	require.NoError(t, err)

	tr.arm()
	msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
	_, err = inbox.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(msg)
	require.NoError(t, err)
	path := tr.path()
	require.NotEmpty(t, path, "no INSERT reached pgx")
	return path
}

// pgxTracer records the statements pgx sends, alone or in a batch, in tr.
type pgxTracer struct{ tr *tracer }

func (p pgxTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	p.tr.record(d.SQL)
	return ctx
}

func (pgxTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (pgxTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (p pgxTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	p.tr.record(d.SQL)
}

func (pgxTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// tracer is the SQLite driver (and, through pgxTracer, pgx's tracer),
// recording the stack of the first INSERT once armed.
type tracer struct {
	mu    sync.Mutex
	armed bool
	pcs   []uintptr
}

func (tr *tracer) arm() { tr.mu.Lock(); tr.armed = true; tr.mu.Unlock() }

func (tr *tracer) record(query string) {
	if !strings.HasPrefix(strings.TrimSpace(query), "INSERT") {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if !tr.armed || tr.pcs != nil {
		return
	}
	pcs := make([]uintptr, 128)
	tr.pcs = pcs[:runtime.Callers(3, pcs)]
}

// path is the recorded stack's frames in the library's own files (not
// its tests, not the standard library or other modules), as file:function
// relative to the module root, outermost first.
func (tr *tracer) path() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	_, self, _, _ := runtime.Caller(0) // <root>/middleware/claimpath_test.go
	root := filepath.Dir(filepath.Dir(self)) + string(filepath.Separator)
	const lib = "github.com/idemkit/watermill-idempotent/"
	var out []string
	frames := runtime.CallersFrames(tr.pcs)
	for {
		f, more := frames.Next()
		if rel, ok := strings.CutPrefix(f.File, root); ok && !strings.HasSuffix(f.File, "_test.go") {
			out = append([]string{rel + ":" + strings.TrimPrefix(f.Function, lib)}, out...)
		}
		if !more {
			return out
		}
	}
}

func (tr *tracer) Open(name string) (driver.Conn, error) {
	c, err := (&msqlite.Driver{}).Open(name)
	if err != nil {
		return nil, err
	}
	return &tracedConn{Conn: c, tr: tr}, nil
}

// tracedConn passes everything to SQLite's connection, recording
// statements on their way.
type tracedConn struct {
	driver.Conn
	tr *tracer
}

func (c *tracedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *tracedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	c.tr.record(query)
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (c *tracedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.tr.record(query)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c *tracedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.tr.record(query)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}
