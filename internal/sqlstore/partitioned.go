package sqlstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
	"github.com/idemkit/watermill-idempotent/sqldialect"
)

// PartitionConfig configures a PartitionedInbox.
type PartitionConfig struct {
	// Table is the inbox table (see Config). Default
	// repository.DefaultTableName.
	Table string
	// Interval is the span of expires_at one partition holds; cleanup
	// removes records a whole interval at a time, so a record outlives its
	// ExpiresAt by up to one Interval. It must divide 24 hours and be at
	// least a minute, so partitions start at the same UTC times in every
	// process. Default 24 hours.
	Interval time.Duration
	// Ahead is how far past now Migrate and every DeleteExpired create
	// partitions, so that claims find theirs ready. Make it exceed the
	// inbox retention; a claim expiring past it creates its partition
	// itself (see PartitionedInbox.ClaimOn). Default 8 days.
	Ahead time.Duration
}

func (c *PartitionConfig) setDefaults() {
	if c.Table == "" {
		c.Table = repository.DefaultTableName
	}
	if c.Interval == 0 {
		c.Interval = 24 * time.Hour
	}
	if c.Ahead == 0 {
		c.Ahead = 8 * 24 * time.Hour
	}
}

// Validate reports whether the configuration is usable.
func (c PartitionConfig) Validate() error {
	var errs []error
	if c.Table != "" {
		errs = append(errs, repository.ValidateTableName(c.Table))
	}
	if c.Interval != 0 && (c.Interval < time.Minute || (24*time.Hour)%c.Interval != 0) {
		errs = append(errs, fmt.Errorf("%w: Interval %s must divide 24h and be at least a minute", repository.ErrInvalidParams, c.Interval))
	}
	if c.Ahead < 0 {
		errs = append(errs, fmt.Errorf("%w: Ahead %s is negative", repository.ErrInvalidParams, c.Ahead))
	}
	return errors.Join(errs...)
}

// ddlLockTimeout bounds how long maintenance waits for the locks to
// create a partition.
const ddlLockTimeout = "10s"

// PartitionedInbox is the inbox on a PostgreSQL table range-partitioned by
// expires_at, one partition per Interval; cleanup detaches and drops
// whole expired partitions instead of deleting rows.
//
// PostgreSQL cannot enforce a unique constraint across partitions unless
// it includes the partition key, and a redelivery computes a new
// expires_at, so the primary key (consumer, dedup_key, expires_at) does
// not stop a second row for a key. Claims are serialised by the database
// instead: every insert (ClaimOn, Acquire) first takes a transaction-scoped
// advisory lock on (table, consumer, key), then looks the key up in every
// partition and inserts only if it is absent. A second claim of the key
// waits on the lock until the first transaction ends and then sees its
// row, exactly as a second insert waits on a unique index entry. The
// table part of every lock (claims' and maintenance's) is the table's OID,
// which the database resolves in the locking statement itself from the
// configured name, as it resolves the statements that follow: "t",
// "public.t" and "t" under search_path public are one table and one lock.
// Every other operation (reads, result, lease updates, release, operator
// and stats) is the Inbox's, unchanged: none of them changes expires_at.
type PartitionedInbox struct {
	// in is the plain store on the partitioned table; it is not embedded,
	// so that no claim path of it (batch, literal, prepared) that skips
	// the lock is ever promoted: each method is forwarded or replaced.
	in              *Inbox
	interval, ahead time.Duration
	insert, acquire Stmt

	create sync.Mutex // one maintenance creator per process
	mu     sync.Mutex
	known  map[int64]bool // partition starts (Unix seconds) known to exist
	// pending: partitions this process created in a caller's transaction,
	// not known to be committed.
	pending map[int64]bool
}

// NewPartitionedInbox returns the partitioned inbox of dialect d (which
// must be PostgreSQL's) over db. Migrate creates the table and the
// partitions up to now+Ahead.
func NewPartitionedInbox(d *Dialect, db DB, config PartitionConfig) (*PartitionedInbox, error) {
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", d.Name, err)
	}
	config.setDefaults()
	in, err := NewInbox(d, db, Config{Table: config.Table})
	if err != nil {
		return nil, err
	}
	if in.migrator, err = d.line("partitioned_inbox", repository.DefaultTableName).migrator(db, config.Table); err != nil {
		return nil, err
	}
	s := &PartitionedInbox{in: in, interval: config.Interval, ahead: config.Ahead, known: map[int64]bool{}, pending: map[int64]bool{}}
	b := func(q string) Stmt { return d.Statement(in.t.quoted, q) }
	// See the statements' comment on the PostgreSQL page (postgres.go).
	s.insert = b(d.Inbox.PartitionedClaim.Text)
	s.acquire = b(d.Inbox.PartitionedAcquire.Text)
	return s, nil
}

// tableLock is the advisory lock key of ($1, $2): the OID of the table
// named $1 (a quoted name, resolved like the statements that use it) in
// the high 32 bits, XORed with $2, a hash from advisoryKey. For one table
// it is a bijection of $2, so locks taken in the order of $2 are taken in
// one global order.
const tableLock = `(($1::text::regclass::oid::bigint << 32) # $2::bigint)`

const (
	// lockClaim takes a key's lock and reports the isolation level in one
	// statement: only under READ COMMITTED does the next statement see a
	// row that the transaction it waited for committed.
	lockClaim = `SELECT current_setting('transaction_isolation') FROM pg_advisory_xact_lock` + tableLock
	// lockMaintenance and lockMaintenanceTx take the lock of partition
	// maintenance (for a session, which returns its key for the unlock,
	// or for the transaction).
	lockMaintenance   = `SELECT k FROM (SELECT ` + tableLock + ` AS k) l, pg_advisory_lock(l.k)`
	lockMaintenanceTx = `SELECT pg_advisory_xact_lock` + tableLock
)

// maintenanceKey is the hash of maintenance's lock (see tableLock).
var maintenanceKey = advisoryKey("partitions")

// advisoryKey hashes parts into a 64-bit hash for tableLock. Two keys
// that collide only make their claims wait for each other.
func advisoryKey(parts ...string) int64 {
	h := fnv.New64a()
	for _, p := range parts {
		_, _ = h.Write([]byte(p))
		_, _ = h.Write([]byte{0})
	}
	return int64(h.Sum64()) //nolint:gosec // a lock key, any 64 bits do
}

// Migrate creates the partitioned table (its own migration line,
// "partitioned_inbox", recorded in MigrationsTable) and the partitions
// from now to now+Ahead.
func (s *PartitionedInbox) Migrate(ctx context.Context) error {
	_, err := s.Migrations(ctx)
	return err
}

// Migrations is Migrate returning the migrations it applied.
func (s *PartitionedInbox) Migrations(ctx context.Context) ([]Migration, error) {
	applied, err := s.in.Migrations(ctx)
	if err != nil {
		return applied, err
	}
	return applied, s.in.wrap("create partitions", s.ensureRange(ctx, time.Now()))
}

// ClaimOn claims the key in the caller's transaction, which must run at
// READ COMMITTED (PostgreSQL's default; anything else is refused with
// repository.ErrInvalidParams, because a snapshot taken before the lock
// wait would hide the row of the claim it waited for). It takes the key's
// advisory lock, held until the transaction ends, then inserts the marker
// only if no partition holds the key; if one does, it returns that record.
//
// If no partition holds p.ExpiresAt yet (maintenance fell behind Ahead),
// it creates one in the caller's transaction, under the maintenance
// advisory lock: claims needing the same partition wait for that
// transaction to end. It never needs a second connection, so a pool that
// every handler's transaction fills cannot deadlock on it.
func (s *PartitionedInbox) ClaimOn(ctx context.Context, ex Executor, p repository.ClaimParams) (repository.Claim, error) {
	if err := storekit.ValidateClaim(p); err != nil {
		return repository.Claim{}, err
	}
	key := repository.StorageKey(p.Key)
	if err := s.ensureIn(ctx, ex, p.ExpiresAt); err != nil {
		return repository.Claim{}, s.in.wrap("claim: create partition", err)
	}
	if err := s.lock(ctx, ex, p.Consumer, key); err != nil {
		return repository.Claim{}, s.in.wrap("claim", err)
	}
	var c repository.Claim
	var err error
	c.Claimed, c.Existing, err = s.insertOrRead(ctx, ex, s.insert, p.Consumer, key, p.PayloadHash, p.Now.UTC(), p.ExpiresAt.UTC())
	if err != nil {
		return repository.Claim{}, s.in.wrap("claim", err)
	}
	return c, nil
}

// insertOrRead runs insert (s.insert or s.acquire) under the key's lock:
// it inserts the key's record if no partition holds the key (true), or
// returns the record one holds.
func (s *PartitionedInbox) insertOrRead(ctx context.Context, ex Executor, insert Stmt, args ...any) (bool, repository.Record, error) {
	rec, err := s.in.get(ctx, ex, insert, args...)
	if errors.Is(err, repository.ErrNotFound) {
		return true, repository.Record{}, nil
	}
	return false, rec, s.forgetMissing(err)
}

// lock takes the key's advisory lock in ex's transaction and checks the
// isolation level.
func (s *PartitionedInbox) lock(ctx context.Context, ex Executor, consumer, key string) error {
	var level string
	if err := ex.QueryRow(ctx, lockClaim, s.in.t.quoted, advisoryKey(consumer, key)).Scan(&level); err != nil {
		return err
	}
	if level != "read committed" {
		return fmt.Errorf("%w: the partitioned inbox claims under READ COMMITTED only, the transaction runs at %s", repository.ErrInvalidParams, strings.ToUpper(level))
	}
	return nil
}

// Acquire implements repository.TwoPhase: in one short READ COMMITTED
// transaction it takes the key's advisory lock, inserts the in-progress
// record if no partition holds the key, and otherwise reads the record
// there.
func (s *PartitionedInbox) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if err := storekit.ValidateAcquire(p); err != nil {
		return repository.Acquisition{}, err
	}
	key := repository.StorageKey(p.Key)
	if err := s.ensure(ctx, p.ExpiresAt); err != nil {
		return repository.Acquisition{}, s.in.wrap("acquire: create partition", err)
	}
	var out repository.Acquisition
	var err error
	for range attempts {
		err = s.in.db.InTx(ctx, true, func(tx Executor) error {
			if err := s.lock(ctx, tx, p.Consumer, key); err != nil {
				return err
			}
			var err error
			out.Acquired, out.Existing, err = s.insertOrRead(ctx, tx, s.acquire,
				p.Consumer, key, p.PayloadHash, p.Owner, p.LeaseUntil.UTC(), p.Now.UTC(), p.ExpiresAt.UTC())
			return err
		})
		// A deadlock victim runs again, up to attempts times.
		if !s.in.again(err) {
			break
		}
	}
	return out, s.in.wrap("acquire", err)
}

// DeleteExpired implements repository.Cleaner by partitions: it creates
// the partitions up to before+Ahead, then detaches (DETACH PARTITION …
// CONCURRENTLY, which waits for transactions using the table but blocks
// no claim) and drops every partition whose whole range lies before
// before, and returns how many records those held. It drops whole
// partitions whatever limit says — a drop costs the same for any number
// of rows — and keeps expired records of the partition that holds
// before until that partition has passed too. Maintenance is serialised
// across processes by an advisory lock.
func (s *PartitionedInbox) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.in.checkLimit(limit); err != nil {
		return 0, err
	}
	if err := s.ensureRange(ctx, before); err != nil {
		return 0, s.in.wrap("delete expired: create partitions", err)
	}
	deleted := 0
	err := s.in.db.OnSession(ctx, func(ex Executor) error {
		var lockKey int64
		if err := ex.QueryRow(ctx, lockMaintenance, s.in.t.quoted, maintenanceKey).Scan(&lockKey); err != nil {
			return err
		}
		defer func() { _, _ = ex.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, lockKey) }()
		parts, err := s.partitions(ctx, ex)
		if err != nil {
			return err
		}
		for _, pt := range parts {
			if pt.end.After(before) {
				continue
			}
			detach := `ALTER TABLE ` + s.in.t.quoted + ` DETACH PARTITION ` + pt.name + ` CONCURRENTLY`
			if pt.pending { // a detach interrupted earlier
				detach = `ALTER TABLE ` + s.in.t.quoted + ` DETACH PARTITION ` + pt.name + ` FINALIZE`
			}
			if _, err := ex.Exec(ctx, detach); err != nil {
				return fmt.Errorf("detach %s: %w", pt.name, err)
			}
			// Detached, nothing writes to it: the count is exact.
			var n int
			if err := ex.QueryRow(ctx, `SELECT COUNT(*) FROM `+pt.name).Scan(&n); err != nil {
				return err
			}
			if _, err := ex.Exec(ctx, `DROP TABLE `+pt.name); err != nil {
				return fmt.Errorf("drop %s: %w", pt.name, err)
			}
			deleted += n
			s.mu.Lock()
			delete(s.known, pt.start.Unix())
			s.mu.Unlock()
		}
		return nil
	})
	return deleted, s.in.wrap("delete expired", err)
}

// partition is one partition of the table.
type partition struct {
	name       string // quoted, schema-qualified
	start, end time.Time
	pending    bool // detach pending (an interrupted DETACH … CONCURRENTLY)
}

// partitions lists the table's range partitions, oldest first. Bounds are
// read back from the catalog in the session's time zone, the one they are
// printed in.
func (s *PartitionedInbox) partitions(ctx context.Context, ex Executor) ([]partition, error) {
	out, err := collect(ctx, ex, s.in.d.Statement(s.in.t.quoted, `SELECT c.oid::regclass::text, i.inhdetachpending,
	(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']+)''\)'))[1]::timestamptz,
	(regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = $1::regclass`), func(r Row) (partition, error) {
		var pt partition
		return pt, r.Scan(&pt.name, &pt.pending, &pt.start, &pt.end)
	}, s.in.t.quoted)
	slices.SortFunc(out, func(a, b partition) int { return a.start.Compare(b.start) })
	return out, err
}

// ensureRange creates the partitions from the one holding from to the one
// holding from+Ahead.
func (s *PartitionedInbox) ensureRange(ctx context.Context, from time.Time) error {
	for t := from.UTC().Truncate(s.interval); !t.After(from.Add(s.ahead)); t = t.Add(s.interval) {
		if err := s.ensure(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// ensure creates the partition holding t unless this store knows it
// exists, in a transaction of its own (see create). Creating a plain table
// and attaching it takes a SHARE UPDATE EXCLUSIVE lock on the parent,
// which claims (ROW EXCLUSIVE) do not conflict with, where CREATE TABLE …
// PARTITION OF would take ACCESS EXCLUSIVE and stop every claim.
func (s *PartitionedInbox) ensure(ctx context.Context, t time.Time) error {
	start := t.UTC().Truncate(s.interval)
	if s.isKnown(start) {
		return nil
	}
	s.create.Lock()
	defer s.create.Unlock()
	if s.isKnown(start) {
		return nil
	}
	err := s.in.db.InTx(ctx, true, func(ex Executor) error {
		if _, err := ex.Exec(ctx, `SET LOCAL lock_timeout = '`+ddlLockTimeout+`'`); err != nil {
			return err
		}
		return s.createIn(ctx, ex, start)
	})
	if err == nil {
		s.setKnown(start)
	}
	return err
}

// ensureIn is ensure in the caller's transaction ex: it looks the
// partition up in the catalog, and creates it there if it is missing. The
// partition is known only once a later look finds it committed.
func (s *PartitionedInbox) ensureIn(ctx context.Context, ex Executor, t time.Time) error {
	start := t.UTC().Truncate(s.interval)
	if s.isKnown(start) {
		return nil
	}
	_, exists, err := s.exists(ctx, ex, start)
	if err != nil {
		return err
	}
	if exists {
		// A partition this process created in a caller's transaction is
		// visible to that transaction before it commits (a batch claims
		// several keys in one): only maintenance's own look, which sees
		// committed tables only, may then mark it known.
		s.mu.Lock()
		if !s.pending[start.Unix()] {
			s.known[start.Unix()] = true
		}
		s.mu.Unlock()
		return nil
	}
	if err := s.createIn(ctx, ex, start); err != nil {
		return err
	}
	s.mu.Lock()
	s.pending[start.Unix()] = true
	s.mu.Unlock()
	return nil
}

// exists looks the partition starting at start up in pg_class, in the
// table's own schema, and returns the partition's quoted, qualified name.
// The schema is the one the database resolves the configured name to,
// not current_schema(): an unqualified name may be found further along
// the search_path, and every spelling of the table must find the same
// partitions. It reads pg_class with the statement's snapshot:
// to_regclass reads the catalog cache, which a session refreshes only
// when it locks a relation, so after waiting on the advisory lock it
// could still miss a partition just committed.
func (s *PartitionedInbox) exists(ctx context.Context, ex Executor, start time.Time) (name string, exists bool, err error) {
	bare := repository.IndexName(s.in.t.name, "p"+start.Format("20060102t1504"))
	err = ex.QueryRow(ctx, `SELECT format('%I.%I', n.nspname, $1::text), EXISTS (SELECT 1 FROM pg_class c WHERE c.relname = $1 AND c.relnamespace = n.oid)
FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace WHERE t.oid = $2::text::regclass`, bare, s.in.t.quoted).Scan(&name, &exists)
	return name, exists, err
}

// createIn creates and attaches the partition starting at start in ex's
// transaction, under the maintenance advisory lock (held until that
// transaction ends), unless it exists once the lock is held.
func (s *PartitionedInbox) createIn(ctx context.Context, ex Executor, start time.Time) error {
	if _, err := ex.Exec(ctx, lockMaintenanceTx, s.in.t.quoted, maintenanceKey); err != nil {
		return err
	}
	name, exists, err := s.exists(ctx, ex, start)
	if err != nil || exists {
		return err
	}
	// Bounds are Go-formatted UTC times, never user input: DDL takes no
	// parameters.
	for _, ddl := range []string{
		`CREATE TABLE ` + name + ` (LIKE ` + s.in.t.quoted + ` INCLUDING DEFAULTS)`,
		fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, s.in.t.quoted, name,
			start.Format(time.RFC3339), start.Add(s.interval).Format(time.RFC3339)),
	} {
		if _, err := ex.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("partition %s: %w", name, err)
		}
	}
	return nil
}

func (s *PartitionedInbox) isKnown(start time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known[start.Unix()]
}

// setKnown records a partition seen committed.
func (s *PartitionedInbox) setKnown(start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known[start.Unix()] = true
	delete(s.pending, start.Unix())
}

// forgetMissing clears the cache of known partitions when an insert found
// none for its row (another process dropped it: SQLSTATE 23514), so that
// the next claim creates it; err passes unchanged.
func (s *PartitionedInbox) forgetMissing(err error) error {
	if sqldialect.SQLState(err) == "23514" {
		s.mu.Lock()
		clear(s.known)
		s.mu.Unlock()
	}
	return err
}

// ClaimBatchOn claims every key of params in ex's transaction with
// ClaimOn, taking the keys' locks in one global order (by lock key), so
// two batches sharing keys cannot deadlock on them. A (consumer, key)
// given twice is refused with repository.ErrInvalidParams, as by Inbox.
func (s *PartitionedInbox) ClaimBatchOn(ctx context.Context, ex Executor, params []repository.ClaimParams) ([]repository.Claim, error) {
	order := make([]int, len(params))
	keys := make([]int64, len(params))
	seen := make(map[[2]string]bool, len(params))
	for i, p := range params {
		key, err := batchRow(s.in.d, seen, i, p)
		if err != nil {
			return nil, err
		}
		order[i] = i
		keys[i] = advisoryKey(p.Consumer, key)
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
	claims := make([]repository.Claim, len(params))
	for _, i := range order {
		var err error
		if claims[i], err = s.ClaimOn(ctx, ex, params[i]); err != nil {
			return nil, err
		}
	}
	return claims, nil
}

// RetryableTx is the Retryable of repository.Driver: a deadlock victim
// or a serialization failure.
func (s *PartitionedInbox) RetryableTx(err error) bool { return s.in.RetryableTx(err) }

// The operations below neither insert a key nor change expires_at: they
// are the plain store's.

// SaveResultOn stores p's result in the transaction ex runs in.
func (s *PartitionedInbox) SaveResultOn(ctx context.Context, ex Executor, p repository.SaveResultParams) error {
	return s.in.SaveResultOn(ctx, ex, p)
}

// Get implements repository.Reader.
func (s *PartitionedInbox) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	return s.in.Get(ctx, consumer, key)
}

// Reclaim implements repository.TwoPhase (see Inbox.Reclaim).
func (s *PartitionedInbox) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	return s.in.Reclaim(ctx, p)
}

// Extend implements repository.TwoPhase (see Inbox.Extend).
func (s *PartitionedInbox) Extend(ctx context.Context, p repository.LeaseParams) error {
	return s.in.Extend(ctx, p)
}

// Complete implements repository.TwoPhase (see Inbox.Complete).
func (s *PartitionedInbox) Complete(ctx context.Context, p repository.CompleteParams) error {
	return s.in.Complete(ctx, p)
}

// Release implements repository.TwoPhase (see Inbox.Release).
func (s *PartitionedInbox) Release(ctx context.Context, p repository.LeaseParams) error {
	return s.in.Release(ctx, p)
}

// ListStuck implements repository.Operator (see Inbox.ListStuck).
func (s *PartitionedInbox) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	return s.in.ListStuck(ctx, p)
}

// Resolve implements repository.Operator (see Inbox.Resolve).
func (s *PartitionedInbox) Resolve(ctx context.Context, p repository.ResolveParams) error {
	return s.in.Resolve(ctx, p)
}

// CountRecords implements repository.Stats (see Inbox.CountRecords).
func (s *PartitionedInbox) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	return s.in.CountRecords(ctx, now)
}
