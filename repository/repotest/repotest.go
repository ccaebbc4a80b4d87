// Package repotest is the conformance suite every inbox backend passes.
// A backend's test only wires it up:
//
//	func TestConformance(t *testing.T) {
//		db := openTestDB(t)
//		repotest.Run(t, repotest.Backend{
//			Name:     "postgres",
//			DB:       db,
//			Features: repotest.Features{Transactional: true},
//			New: func(t *testing.T, table string) (repotest.Repository, error) {
//				repo, err := postgres.NewRepository(db, postgres.Config{Table: table})
//				if err != nil {
//					return nil, err
//				}
//				t.Cleanup(func() { dropTable(db, table) })
//				return repo, repo.Migrate(context.Background())
//			},
//		})
//	}
//
// Every case runs in parallel on a table of its own with a random name, so
// the suite can run against a shared server and re-run on a dirty database.
// Cases are grouped by area: claim.go, concurrency.go, expiry.go,
// identifiers.go, twophase.go, operator.go, stats.go, batch.go.
package repotest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/stretchr/testify/require"
)

// Repository is what every backend provides to the suite. Backends with
// Features.Transactional also implement repository.Driver[*sql.Tx], those
// with Features.TwoPhase also implement repository.TwoPhase.
type Repository interface {
	repository.Reader
	repository.Cleaner
}

// Features declares which contracts a backend implements. The suite runs
// the cases of each declared contract and fails if the backend does not
// implement the matching interface.
type Features struct {
	// Transactional: the backend is a repository.Driver[*sql.Tx] and
	// Backend.DB is the database its transactions run on.
	Transactional bool
	// TwoPhase: the backend implements repository.TwoPhase (lease-based
	// acquire, reclaim, extend, complete, release).
	TwoPhase bool
	// NoSQLTable: the backend keeps no SQL table (memory, Redis). The name
	// New receives only namespaces a case's records, so the cases about
	// table names are skipped.
	NoSQLTable bool
	// ExpiryByTTL: the store deletes expired records by itself (Redis
	// TTL) and DeleteExpired is a no-op returning 0. The cleanup case then
	// checks that expired records are gone and live ones kept without
	// counting deletions.
	ExpiryByTTL bool
	// CleanupInterval: the store removes expired records a whole interval
	// of expiry at a time (PostgreSQL's partitioned inbox drops a
	// partition): DeleteExpired(before, limit) removes every record
	// expiring before before.Truncate(CleanupInterval), whatever limit
	// says, and may keep those expiring after that until their interval
	// has passed. Zero: records are deleted one by one, at most limit per
	// call.
	CleanupInterval time.Duration
	// Operator: the backend implements repository.Operator (listing and
	// resolving stuck two-phase records); requires TwoPhase.
	Operator bool
	// Stats: the backend implements repository.Stats (counting records
	// by consumer and state); requires TwoPhase, whose calls seed the
	// records.
	Stats bool
	// Batch: the backend's Driver.Claim claims several params in one
	// call (group commit's multi-row claims: duplicates in place, racing
	// batches with overlapping keys); requires Transactional.
	Batch bool
}

// Backend describes the backend under test.
type Backend struct {
	// Name labels the backend in failure messages.
	Name string
	// DB is the database the transactional cases open transactions on;
	// required with Features.Transactional, unused otherwise.
	DB *sql.DB
	// Features declares the implemented contracts.
	Features Features
	// New returns a repository over a ready (migrated) table with the given
	// name, registering its removal with t.Cleanup. It must refuse an
	// invalid table name with an error wrapping
	// repository.ErrInvalidTableName, and may be called twice with the same
	// name (schema creation is idempotent).
	New func(t *testing.T, table string) (Repository, error)
}

// Run runs every case that applies to b as parallel subtests of t.
func Run(t *testing.T, b Backend) {
	require.NotNil(t, b.New, "Backend.New is required")
	t.Run("Identifiers", func(t *testing.T) { runIdentifiers(t, b) })
	t.Run("Expiry", func(t *testing.T) { runExpiry(t, b) })
	if b.Features.Transactional {
		require.NotNil(t, b.DB, "Backend.DB is required for the transactional contract")
		t.Run("Claim", func(t *testing.T) { runClaim(t, b) })
		t.Run("Concurrency", func(t *testing.T) { runConcurrency(t, b) })
	}
	if b.Features.Batch {
		t.Run("Batch", func(t *testing.T) { runBatch(t, b) })
	}
	if b.Features.TwoPhase {
		t.Run("TwoPhase", func(t *testing.T) { runTwoPhase(t, b) })
	}
	if b.Features.Operator {
		t.Run("Operator", func(t *testing.T) { runOperator(t, b) })
	}
	if b.Features.Stats {
		t.Run("Stats", func(t *testing.T) { runStats(t, b) })
	}
}

// fixture is one case's or benchmark's repository on its own table, with
// the contracts its backend declares.
type fixture struct {
	b     Backend
	table string
	repo  Repository
	tx    repository.Driver[*sql.Tx]
	tp    repository.TwoPhase
	op    repository.Operator
	st    repository.Stats
	batch repository.Driver[*sql.Tx]
}

// runCase runs body as a parallel subtest of t named name, on a fixture
// of its own: every case has a table no other case touches.
func runCase(t *testing.T, b Backend, name string, body func(t *testing.T, f *fixture)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		t.Parallel()
		body(t, newFixture(t, b))
	})
}

func newFixture(t *testing.T, b Backend) *fixture {
	t.Helper()
	f, err := openFixture(b, "repotest", func(table string) (Repository, error) { return b.New(t, table) })
	require.NoError(t, err)
	return f
}

// openFixture opens a repository with newRepo on a fresh table and checks
// that it implements the contracts b declares.
func openFixture(b Backend, prefix string, newRepo func(table string) (Repository, error)) (*fixture, error) {
	f := &fixture{b: b, table: RandomName(prefix)}
	var err error
	if f.repo, err = newRepo(f.table); err != nil {
		return nil, fmt.Errorf("%s: New(%q): %w", b.Name, f.table, err)
	}
	return f, f.capabilities()
}

// capabilities sets f's contracts from f.repo, or returns an error naming
// each one the backend declares but does not implement.
func (f *fixture) capabilities() error {
	feat := f.b.Features
	var errs [5]error
	f.tx, errs[0] = contract[repository.Driver[*sql.Tx]](f, "Transactional", feat.Transactional)
	f.tp, errs[1] = contract[repository.TwoPhase](f, "TwoPhase", feat.TwoPhase)
	f.op, errs[2] = contract[repository.Operator](f, "Operator", feat.Operator)
	f.st, errs[3] = contract[repository.Stats](f, "Stats", feat.Stats)
	f.batch, errs[4] = contract[repository.Driver[*sql.Tx]](f, "Batch", feat.Batch)
	return errors.Join(errs[:]...)
}

// contract returns f.repo as C (nil if it is not one), and an error if the
// backend declares feature but f.repo does not implement C.
func contract[C any](f *fixture, feature string, declared bool) (C, error) {
	c, ok := f.repo.(C)
	if declared && !ok {
		return c, fmt.Errorf("%s declares Features.%s but %T does not implement %s", f.b.Name, feature, f.repo, reflect.TypeFor[C]())
	}
	return c, nil
}

// beginTx begins a transaction on the backend's DB that is rolled back
// when the test ends unless committed.
func (f *fixture) beginTx(t *testing.T) *sql.Tx {
	t.Helper()
	tx, err := f.b.DB.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// claim runs one claim in its own transaction and commits it.
func (f *fixture) claim(t *testing.T, p repository.ClaimParams, result []byte) repository.Claim {
	t.Helper()
	ctx := context.Background()
	tx := f.beginTx(t)
	c, err := claimOne(ctx, f.tx, tx, p)
	require.NoError(t, err)
	if c.Claimed && result != nil {
		require.NoError(t, f.tx.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: p.Consumer, Key: p.Key, Result: result}))
	}
	require.NoError(t, tx.Commit())
	return c
}

// claimOpen claims p, requiring a fresh claim, in a transaction it leaves
// open for the caller to end (rolled back when the test ends otherwise).
func (f *fixture) claimOpen(t *testing.T, p repository.ClaimParams) *sql.Tx {
	t.Helper()
	tx := f.beginTx(t)
	c, err := claimOne(t.Context(), f.tx, tx, p)
	require.NoError(t, err)
	require.True(t, c.Claimed, "%s: claim %q/%q must be fresh", f.b.Name, p.Consumer, p.Key)
	return tx
}

// inTx runs fn in a transaction on db and commits it when fn returns nil;
// otherwise it rolls the transaction back and returns fn's error.
func inTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// race runs racer(i) for every i below n, each on its own goroutine, all
// released at once, and returns when every racer has: the errors they
// returned, by racer.
func race(n int, racer func(i int) error) []error {
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			errs[i] = racer(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// RandomName returns prefix_ and 12 random hex digits: a table, key or
// topic name no other test run uses.
func RandomName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

// ClaimParams returns valid params for key created now (UTC, whole
// microseconds) and expiring in a day, with the payload hash of the key
// itself; backend tests build their own cases on it.
func ClaimParams(consumer, key string) repository.ClaimParams {
	now := time.Now().UTC().Truncate(time.Microsecond)
	return repository.ClaimParams{
		Consumer:    consumer,
		Key:         key,
		PayloadHash: repository.HashPayload([]byte(key)),
		Now:         now,
		ExpiresAt:   now.Add(24 * time.Hour),
	}
}

// unstorable are keys and entities that no backend can store as they are:
// NUL bytes (PostgreSQL text refuses them), invalid UTF-8 (PostgreSQL and
// MySQL's utf8mb4 refuse it) and more bytes than the columns hold. The
// contract is that each is stored safely, in its hashed form (see
// repository.StorageKey), the same way on every backend.
var unstorable = []struct{ name, value string }{
	{"nul", "order\x00-1"},
	{"only-nul", "\x00"},
	{"invalid-utf8", "order-\xff\xfe-1"},
	{"300-bytes", strings.Repeat("k", 300)},
	{"255-bytes-ending-in-nul", strings.Repeat("k", repository.MaxKeyLength-1) + "\x00"},
}

// invalidConsumers are consumer names every backend refuses with
// repository.ErrInvalidParams: consumers are stored as they are, not
// hashed.
var invalidConsumers = map[string]string{
	"consumer with NUL":           "bill\x00ing",
	"consumer with invalid UTF-8": "bill\xffing",
	"long consumer":               strings.Repeat("c", repository.MaxConsumerLength+1),
}

// requireStoredForm checks that a stored key is what StorageKey gives for
// key, and that it is short valid UTF-8 without NUL bytes.
func requireStoredForm(t *testing.T, key, stored string) {
	t.Helper()
	require.Equal(t, repository.StorageKey(key), stored)
	require.LessOrEqual(t, len(stored), repository.MaxKeyLength)
	require.True(t, utf8.ValidString(stored), "stored key %q is not valid UTF-8", stored)
	require.NotContains(t, stored, "\x00")
}

// claimOne claims p alone in tx with d, as the inbox does for one
// delivery.
func claimOne(ctx context.Context, d repository.Driver[*sql.Tx], tx *sql.Tx, p repository.ClaimParams) (repository.Claim, error) {
	claims, err := d.Claim(ctx, tx, []repository.ClaimParams{p})
	if err != nil {
		return repository.Claim{}, err
	}
	return claims[0], nil
}
