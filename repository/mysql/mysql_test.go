package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/watermill-idempotent/internal/testsupport/sqlstoretest"
	"github.com/idemkit/watermill-idempotent/internal/testsupport/testenv"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/repository/mysql"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

func TestConformance(t *testing.T)     { sqlstoretest.Run(t, sqlstoretest.MySQL(t)) }
func BenchmarkRepository(b *testing.B) { sqlstoretest.Bench(b, sqlstoretest.MySQL(b)) }

// TestClaimReportsNonDuplicateErrors proves that only a duplicate key is
// reported as a duplicate. The table's columns are narrowed after
// migration so that a claim can hit errors INSERT IGNORE would hide:
// NULL into NOT NULL, and a key too long for its column that, cut short,
// equals a stored key. It runs with a strict and a non-strict sql_mode,
// since the latter turns truncation into a warning.
func TestClaimReportsNonDuplicateErrors(t *testing.T) {
	testenv.MySQL(t) // skip or fail like every MySQL test when the server is down
	for _, mode := range []string{"STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION", "NO_ENGINE_SUBSTITUTION"} {
		strict := strings.Contains(mode, "STRICT")
		t.Run(map[bool]string{true: "Strict", false: "NonStrict"}[strict], func(t *testing.T) {
			db := openMySQL(t, func(c *driver.Config) {
				c.Params = map[string]string{"sql_mode": "'" + mode + "'"}
			})
			var sessionMode string
			require.NoError(t, db.QueryRow(`SELECT @@SESSION.sql_mode`).Scan(&sessionMode))
			require.Equal(t, mode, sessionMode)

			repo, table := newRepository(t, db)
			stored := repotest.ClaimParams("billing", "abcdefgh")
			require.True(t, claim(t, db, repo, stored, []byte("stored")).Claimed)
			_, err := db.Exec("ALTER TABLE `" + table + "` MODIFY dedup_key VARBINARY(8) NOT NULL, MODIFY payload_hash VARBINARY(255) NOT NULL")
			require.NoError(t, err)

			// The hazard is real on this server: INSERT IGNORE turns the NULL
			// into '' and then ignores the duplicate, reporting 0 rows — a
			// backend built on it would call this a duplicate.
			tx, err := db.Begin()
			require.NoError(t, err)
			res, err := tx.Exec("INSERT IGNORE INTO `"+table+"` (consumer, dedup_key, state, payload_hash, attempts, created_at, expires_at) VALUES (?, ?, 'completed', NULL, 1, NOW(), NOW())",
				"billing", "abcdefgh")
			require.NoError(t, err)
			n, err := res.RowsAffected()
			require.NoError(t, err)
			require.Zero(t, n, "INSERT IGNORE swallowed the NULL error and reported no insert")
			require.NoError(t, tx.Rollback())

			type testCase struct {
				name   string
				params repository.ClaimParams
				number uint16 // the MySQL error expected; 0 when the server reports none
			}
			nullHash := func(key string) repository.ClaimParams {
				p := repotest.ClaimParams("billing", key)
				p.PayloadHash = nil
				return p
			}
			cases := []testCase{
				{"NULL into NOT NULL, new key", nullHash("fresh"), 1048},
				{"NULL into NOT NULL, stored key", nullHash("abcdefgh"), 1048},
			}
			if strict {
				cases = append(cases,
					testCase{"too long, new key", repotest.ClaimParams("billing", "zzzzzzzz-and-more"), 1406},
					testCase{"too long, cut to a stored key", repotest.ClaimParams("billing", "abcdefgh-and-more"), 1406},
				)
			} else {
				// Without strict mode the server cuts the key to "abcdefgh" and
				// reports the collision as 1062. Claim then finds no record
				// with the key it was given and reports an error instead of a
				// duplicate. (Against the schema Migrate creates, every value
				// is checked to fit before it is sent, so this needs a
				// narrower column than ours.)
				cases = append(cases, testCase{"too long, cut to a stored key", repotest.ClaimParams("billing", "abcdefgh-and-more"), 0})
			}
			for i, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					ctx := t.Context()
					tx, err := db.BeginTx(ctx, nil)
					require.NoError(t, err)
					defer func() { _ = tx.Rollback() }()
					c, err := claimTx(ctx, repo, tx, tc.params)
					require.Error(t, err, "a non-duplicate failure must be an error")
					require.False(t, c.Claimed)
					require.Zero(t, c.Existing, "a failed claim must not be reported as a duplicate")
					var me *driver.MySQLError
					if tc.number != 0 {
						require.ErrorAs(t, err, &me)
						require.Equal(t, tc.number, me.Number, "%v", err)
					} else {
						require.ErrorIs(t, err, repository.ErrNotFound)
					}
					t.Logf("%s: %v", tc.name, err)

					// The transaction survives a failed statement: a valid
					// claim still works in it.
					c, err = claimTx(ctx, repo, tx, repotest.ClaimParams("billing", fmt.Sprintf("ok-%d", i))) // fits the narrowed key
					require.NoError(t, err)
					require.True(t, c.Claimed)
				})
			}
			rec, err := repo.Get(t.Context(), "billing", "abcdefgh")
			require.NoError(t, err)
			require.Equal(t, stored.PayloadHash, rec.PayloadHash, "the stored record is untouched")
			require.Equal(t, []byte("stored"), rec.Result)
		})
	}
}

// TestKeysAreByteExact: keys are compared byte for byte. utf8mb4
// collations would fold case, accents or ß, or ignore trailing spaces.
func TestKeysAreByteExact(t *testing.T) {
	db := testenv.MySQL(t)
	repo, _ := newRepository(t, db)
	keys := []string{"order-1", "order-1 ", " order-1", "Order-1", "café", "cafe", "CAFÉ", "straße", "strasse", "😀", "😁"}
	for _, k := range keys {
		require.True(t, claim(t, db, repo, repotest.ClaimParams("billing", k), []byte(k)).Claimed, "key %q collided with another", k)
	}
	for _, k := range keys {
		rec, err := repo.Get(t.Context(), "billing", k)
		require.NoError(t, err)
		require.Equal(t, k, rec.Key)
		require.Equal(t, []byte(k), rec.Result)
		require.False(t, claim(t, db, repo, repotest.ClaimParams("billing", k), nil).Claimed)
	}
}

// TestDuplicateSeenThroughEarlierSnapshot: a REPEATABLE READ transaction
// whose snapshot predates the stored record still gets it as a duplicate
// (the duplicate is read with a locking read), not "not found".
func TestDuplicateSeenThroughEarlierSnapshot(t *testing.T) {
	db := testenv.MySQL(t)
	repo, table := newRepository(t, db)
	ctx := t.Context()

	tx := beginTx(t, db, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	var n int
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&n)) // takes the snapshot

	require.True(t, claim(t, db, repo, repotest.ClaimParams("billing", "order-1"), []byte("first")).Claimed)
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+table+"`").Scan(&n))
	require.Zero(t, n, "the snapshot must predate the record for this test to mean anything")

	c, err := claimTx(ctx, repo, tx, repotest.ClaimParams("billing", "order-1"))
	require.NoError(t, err)
	require.False(t, c.Claimed)
	require.Equal(t, []byte("first"), c.Existing.Result)
}

// TestSaveAndExtendWithUnchangedValues: MySQL reports an UPDATE that
// stores the value already there as affecting no row; that must not read
// as "not found" or "lease lost".
func TestSaveAndExtendWithUnchangedValues(t *testing.T) {
	db := testenv.MySQL(t)
	repo, _ := newRepository(t, db)
	ctx := t.Context()

	tx := beginTx(t, db, nil)
	c, err := claimTx(ctx, repo, tx, repotest.ClaimParams("billing", "order-1"))
	require.NoError(t, err)
	require.True(t, c.Claimed)
	save := repository.SaveResultParams{Consumer: "billing", Key: "order-1"} // nil over NULL
	require.NoError(t, repo.SaveResult(ctx, tx, save))
	save.Result = []byte("r")
	require.NoError(t, repo.SaveResult(ctx, tx, save))
	require.NoError(t, repo.SaveResult(ctx, tx, save), "saving the same result twice")
	require.NoError(t, tx.Commit())

	now := time.Now().UTC().Truncate(time.Microsecond)
	a, err := repo.Acquire(ctx, repository.AcquireParams{
		Consumer: "billing", Key: "order-2", Owner: "owner-a",
		Now: now, LeaseUntil: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour),
	})
	require.NoError(t, err)
	require.True(t, a.Acquired)
	lease := repository.LeaseParams{Consumer: "billing", Key: "order-2", Owner: "owner-a", LeaseUntil: now.Add(time.Minute)}
	require.NoError(t, repo.Extend(ctx, lease), "extending to the current deadline")
	lease.Owner = "owner-b"
	require.ErrorIs(t, repo.Extend(ctx, lease), repository.ErrLeaseLost, "the check after a no-op extend is fenced by owner")
}

// TestValuesThatDoNotFitAreRefused: values are checked before they are
// sent, so a non-strict sql_mode never gets to truncate them.
func TestValuesThatDoNotFitAreRefused(t *testing.T) {
	db := testenv.MySQL(t)
	repo, _ := newRepository(t, db)
	ctx := t.Context()
	tx := beginTx(t, db, nil)

	for name, mutate := range map[string]func(*repository.ClaimParams){
		"long payload hash": func(p *repository.ClaimParams) { p.PayloadHash = make([]byte, mysql.MaxPayloadHashLength+1) },
		"year 10000":        func(p *repository.ClaimParams) { p.ExpiresAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
		"year 999":          func(p *repository.ClaimParams) { p.Now = time.Date(999, 12, 31, 0, 0, 0, 0, time.UTC) },
	} {
		p := repotest.ClaimParams("billing", "k")
		mutate(&p)
		_, err := claimTx(ctx, repo, tx, p)
		require.ErrorIs(t, err, repository.ErrInvalidParams, name)
	}
	_, err := repo.DeleteExpired(ctx, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), 10)
	require.ErrorIs(t, err, repository.ErrInvalidParams)
}

// TestTimestampsDoNotDependOnDSN: records are stored in UTC and read back
// equal through connections with other parseTime and loc settings.
func TestTimestampsDoNotDependOnDSN(t *testing.T) {
	db := testenv.MySQL(t)
	repo, table := newRepository(t, db)
	textTokyo := openMySQL(t, func(c *driver.Config) { c.ParseTime, c.Loc = false, time.FixedZone("UTC+9", 9*3600) })
	timeNewYork := openMySQL(t, func(c *driver.Config) { c.ParseTime, c.Loc = true, time.FixedZone("UTC-5", -5*3600) })

	p := repotest.ClaimParams("billing", "order-1")
	require.True(t, claim(t, db, repo, p, nil).Claimed)
	for _, other := range []*sql.DB{textTokyo, timeNewYork} {
		r, err := mysql.NewRepository(other, mysql.Config{Table: table})
		require.NoError(t, err)
		rec, err := r.Get(t.Context(), "billing", "order-1")
		require.NoError(t, err)
		require.True(t, p.Now.Equal(rec.CreatedAt), "CreatedAt %s, want %s", rec.CreatedAt, p.Now)
		require.True(t, p.ExpiresAt.Equal(rec.ExpiresAt), "ExpiresAt %s, want %s", rec.ExpiresAt, p.ExpiresAt)

		q := repotest.ClaimParams("billing", repotest.RandomName("via"))
		q.Now = q.Now.In(time.FixedZone("UTC+3", 3*3600))
		require.True(t, claim(t, other, r, q, nil).Claimed)
		rec, err = repo.Get(t.Context(), "billing", q.Key)
		require.NoError(t, err)
		require.True(t, q.Now.Equal(rec.CreatedAt), "CreatedAt %s, want %s", rec.CreatedAt, q.Now)
	}
	var raw string
	require.NoError(t, db.QueryRow("SELECT DATE_FORMAT(created_at, '%Y-%m-%d %H:%i:%s.%f') FROM `"+table+"` WHERE dedup_key = 'order-1'").Scan(&raw))
	require.Equal(t, p.Now.UTC().Format("2006-01-02 15:04:05.000000"), raw, "stored as UTC")
}

// TestMigrateConcurrently runs Migrate for one table from many sessions at
// once, as several processes starting together would.
func TestMigrateConcurrently(t *testing.T) {
	db := testenv.MySQL(t)
	table := repotest.RandomName("mysqltest")
	t.Cleanup(func() { dropTable(t, db, table) })

	const processes = 16
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, processes)
	)
	for i := range processes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			repo, err := mysql.NewRepository(db, mysql.Config{Table: table})
			if err == nil {
				<-start
				err = repo.Migrate(t.Context())
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "migration %d", i)
	}
	repo, err := mysql.NewRepository(db, mysql.Config{Table: table})
	require.NoError(t, err)
	require.True(t, claim(t, db, repo, repotest.ClaimParams("billing", "order-1"), nil).Claimed)
}

// TestCleanupSkipsRowsHeldByClaims: a claim holding an expired record
// locked neither blocks cleanup nor is blocked by it; the row is deleted
// by a later batch.
func TestCleanupSkipsRowsHeldByClaims(t *testing.T) {
	db := testenv.MySQL(t)
	repo, _ := newRepository(t, db)
	now := time.Now().UTC().Truncate(time.Microsecond)
	const expired = 10
	for i := range expired {
		exp := now.Add(-time.Duration(i+1) * time.Minute)
		claim(t, db, repo, repository.ClaimParams{
			Consumer: "billing", Key: fmt.Sprintf("expired-%d", i), Now: exp.Add(-time.Hour), ExpiresAt: exp,
		}, nil)
	}
	claim(t, db, repo, repotest.ClaimParams("billing", "live"), nil)

	// A redelivery of an expired key: the duplicate claim holds the row.
	tx := beginTx(t, db, nil)
	c, err := claimTx(t.Context(), repo, tx, repotest.ClaimParams("billing", "expired-3"))
	require.NoError(t, err)
	require.False(t, c.Claimed)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // a bound, not a wait: cleanup must not block
	defer cancel()
	n, err := repository.DeleteAllExpired(ctx, repo, now, 3)
	require.NoError(t, err, "cleanup must skip the held row, not wait for it")
	require.Equal(t, expired-1, n)

	require.NoError(t, tx.Rollback())
	n, err = repo.DeleteExpired(ctx, now, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the row is deleted once released")
	_, err = repo.Get(ctx, "billing", "live")
	require.NoError(t, err)
}

// TestRolledBackClaimWithManyWaiters shows how InnoDB resolves several
// claims waiting on one that rolls back: one waiter claims, the others
// either see its committed record or fail as deadlock victims (their
// transaction rolled back, to be retried by redelivery). PostgreSQL would
// make them all wait for the new winner instead. Never do two win.
func TestRolledBackClaimWithManyWaiters(t *testing.T) {
	db := testenv.MySQL(t)
	repo, table := newRepository(t, db)
	ctx := t.Context()
	p := repotest.ClaimParams("billing", "order-1")

	first, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	c, err := claimTx(ctx, repo, first, p)
	require.NoError(t, err)
	require.True(t, c.Claimed)

	const waiters = 6
	type outcome struct {
		claim repository.Claim
		err   error
	}
	outcomes := make([]outcome, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outcomes[i].err = func() error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				c, err := claimTx(ctx, repo, tx, p)
				if err != nil {
					return err
				}
				outcomes[i].claim = c
				if c.Claimed {
					if err := repo.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: p.Consumer, Key: p.Key, Result: []byte("winner")}); err != nil {
						return err
					}
				}
				return tx.Commit()
			}()
		}()
	}
	// Roll back only once every waiter is inside its INSERT, blocked by the
	// claim. (MariaDB lists only some of them in INNODB_TRX as LOCK WAIT,
	// so watch the process list.)
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ?`,
			"INSERT INTO `"+table+"`%").Scan(&n)
		return err == nil && n == waiters
	}, 20*time.Second, 5*time.Millisecond)
	require.NoError(t, first.Rollback())
	wg.Wait()

	claimed, duplicates, deadlocks := 0, 0, 0
	for i, o := range outcomes {
		var me *driver.MySQLError
		switch {
		case o.err != nil:
			require.ErrorAs(t, o.err, &me, "waiter %d", i)
			require.EqualValues(t, 1213, me.Number, "waiter %d: only deadlock victims may fail: %v", i, o.err)
			deadlocks++
		case o.claim.Claimed:
			claimed++
		default:
			require.Equal(t, []byte("winner"), o.claim.Existing.Result, "waiter %d", i)
			duplicates++
		}
	}
	require.Equal(t, 1, claimed, "exactly one waiter must claim the key")
	t.Logf("%d waiters behind a rolled-back claim: %d claimed, %d duplicates, %d deadlock victims", waiters, claimed, duplicates, deadlocks)
	rec, err := repo.Get(ctx, "billing", "order-1")
	require.NoError(t, err)
	require.Equal(t, []byte("winner"), rec.Result)
}

// openMySQL opens the test database with configure applied to its DSN.
func openMySQL(t *testing.T, configure func(*driver.Config)) *sql.DB {
	t.Helper()
	testenv.MySQL(t)
	cfg, err := driver.ParseDSN(testenv.MySQLDSN())
	require.NoError(t, err)
	configure(cfg)
	connector, err := driver.NewConnector(cfg)
	require.NoError(t, err)
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, db.PingContext(t.Context()))
	return db
}

// newRepository returns a repository on a fresh migrated table that is
// dropped when t ends.
func newRepository(t *testing.T, db *sql.DB) (*mysql.Repository, string) {
	t.Helper()
	table := repotest.RandomName("mysqltest")
	repo, err := mysql.NewRepository(db, mysql.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { dropTable(t, db, table) })
	require.NoError(t, repo.Migrate(t.Context()))
	return repo, table
}

func dropTable(t *testing.T, db *sql.DB, table string) {
	_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
	require.NoError(t, err)
}

// claim runs one claim in its own transaction, stores result if it won,
// and commits.
func claim(t *testing.T, db *sql.DB, repo *mysql.Repository, p repository.ClaimParams, result []byte) repository.Claim {
	t.Helper()
	ctx := context.Background()
	tx := beginTx(t, db, nil)
	c, err := claimTx(ctx, repo, tx, p)
	require.NoError(t, err)
	if c.Claimed && result != nil {
		require.NoError(t, repo.SaveResult(ctx, tx, repository.SaveResultParams{Consumer: p.Consumer, Key: p.Key, Result: result}))
	}
	require.NoError(t, tx.Commit())
	return c
}

// beginTx begins a transaction that is rolled back when the test ends
// unless committed.
func beginTx(t *testing.T, db *sql.DB, opts *sql.TxOptions) *sql.Tx {
	tx, err := db.BeginTx(t.Context(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// claimTx claims p alone in tx through d, as the inbox does for one
// delivery.
func claimTx(ctx context.Context, d repository.Driver[*sql.Tx], tx *sql.Tx, p repository.ClaimParams) (repository.Claim, error) {
	claims, err := d.Claim(ctx, tx, []repository.ClaimParams{p})
	if err != nil {
		return repository.Claim{}, err
	}
	return claims[0], nil
}
