package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// attempts bounds the reruns of an atomic operation whose record vanished
// before it could be read, or that was a deadlock victim.
const attempts = 32

// Inbox stores inbox records in one SQL table. It implements
// the claims of repository.Driver (see Driver), TwoPhase, Reader, Cleaner,
// Operator and Stats and is safe for concurrent use.
type Inbox struct {
	migrator
	q struct {
		claim, get, lockedGet, save, exists, deleteExpired, pickExpired Stmt
		acquire, reclaim, extend, extendCheck, complete, release        Stmt
		list, resolveComplete, resolveRelease, live, count              Stmt
	}
	batches sync.Map // batchStmtKey → Stmt, see batchInsert
}

// NewInbox returns the inbox store of dialect d over db. It does not
// create the table: call Migrate, or apply the dialect's migration files.
func NewInbox(d *Dialect, db DB, config Config) (*Inbox, error) {
	m, err := d.line("inbox", repository.DefaultTableName).migrator(db, config.Table)
	if err != nil {
		return nil, err
	}
	s := &Inbox{migrator: m}
	b := func(q SQL) Stmt {
		st := d.Bound(m.t.quoted, q)
		st.inline = d.Bind == Question // MySQL: see Stmt.send
		return st
	}
	in := &d.Inbox
	s.q.claim, s.q.get, s.q.lockedGet, s.q.save, s.q.exists = b(in.Claim), b(in.Get), b(in.LockedGet), b(in.Save), b(in.Exists)
	s.q.deleteExpired, s.q.pickExpired = b(in.DeleteExpired), b(in.PickExpired)
	s.q.acquire, s.q.reclaim, s.q.extend, s.q.extendCheck = b(in.Acquire), b(in.Reclaim), b(in.Extend), b(in.ExtendCheck)
	s.q.complete, s.q.release, s.q.list = b(in.Complete), b(in.Release), b(in.List)
	s.q.resolveComplete, s.q.resolveRelease, s.q.live, s.q.count = b(in.ResolveComplete), b(in.ResolveRelease), b(in.Live), b(in.Count)
	return s, nil
}

// ClaimOn claims p with one conditional insert in the transaction ex
// runs in, on any driver (ON CONFLICT DO NOTHING, or on MySQL a plain
// INSERT whose duplicate-key error, recognised by code, means "taken").
// On a duplicate it reads the stored record in the same transaction,
// with a locking read where a snapshot could hide it. A concurrent claim
// of the same key waits on the first one's row lock.
func (s *Inbox) ClaimOn(ctx context.Context, ex Executor, p repository.ClaimParams) (repository.Claim, error) {
	query, args, err := s.claimSQL(p)
	if err != nil {
		return repository.Claim{}, err
	}
	n, err := ex.Exec(ctx, query, args...)
	if s.d.isUniqueViolation(err) {
		n, err = 0, nil
	}
	if err != nil {
		return repository.Claim{}, s.wrap("claim", err)
	}
	return s.claimed(ctx, ex, p, n)
}

// insert runs a conditional insert; if the key is taken, it reads it.
func (s *Inbox) insert(ctx context.Context, ex Executor, insert, read Stmt, args []any) (bool, repository.Record, error) {
	text, vals := insert.send(args)
	n, err := ex.Exec(ctx, text, vals...)
	if s.d.isUniqueViolation(err) {
		n, err = 0, nil
	}
	if err != nil || n == 1 {
		return n == 1, repository.Record{}, err
	}
	rec, err := s.get(ctx, ex, read, args[0], args[1])
	return false, rec, err
}

// SaveResultOn stores p's result with one UPDATE in the transaction ex
// runs in; repository.ErrNotFound if there is no such record.
func (s *Inbox) SaveResultOn(ctx context.Context, ex Executor, p repository.SaveResultParams) error {
	if err := storekit.ValidateSaveResult(p); err != nil {
		return err
	}
	key := repository.StorageKey(p.Key)
	n, err := s.q.save.exec(ctx, ex, p.Consumer, key, p.Result)
	if err == nil && n == 0 && s.d.ChangedRows {
		n, err = s.count(ctx, ex, s.q.exists, p.Consumer, key)
	}
	if err == nil && n == 0 {
		err = repository.ErrNotFound
	}
	return s.wrap("save result", err)
}

// Get implements repository.Reader.
func (s *Inbox) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	return s.GetOn(ctx, s.db, consumer, key)
}

// DeleteExpired implements repository.Cleaner with one statement deleting
// the oldest expired rows by primary key, skipping rows that claims hold
// locked. Where that is not one statement (MySQL), one READ COMMITTED
// transaction picks them with FOR UPDATE SKIP LOCKED and deletes them by
// primary key, at most 500 keys a statement.
func (s *Inbox) DeleteExpired(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.checkLimit(limit); err != nil {
		return 0, err
	}
	args, err := s.args(nil, before, limit)
	if err != nil {
		return 0, s.wrap("delete expired", err)
	}
	if s.d.Inbox.DeleteByKeys == nil {
		n, err := s.q.deleteExpired.exec(ctx, s.db, args...)
		return int(n), s.wrap("delete expired", err)
	}
	deleted := 0
	err = s.db.InTx(ctx, true, func(tx Executor) error {
		pks, err := collect(ctx, tx, s.q.pickExpired, func(r Row) (pk [2][]byte, err error) {
			err = r.Scan(&pk[0], &pk[1])
			return
		}, args...)
		for len(pks) > 0 && err == nil {
			chunk := pks[:min(len(pks), 500)]
			pks = pks[len(chunk):]
			keys := make([]any, 0, 2*len(chunk))
			for _, pk := range chunk {
				keys = append(keys, pk[0], pk[1])
			}
			var n int64
			n, err = s.d.Bound(s.t.quoted, s.d.Inbox.DeleteByKeys(len(chunk))).exec(ctx, tx, keys...)
			deleted += int(n)
		}
		return err
	})
	if err != nil {
		return 0, s.wrap("delete expired", err)
	}
	return deleted, nil
}

// checkLimit refuses a DeleteExpired limit that is not positive.
func (s *Inbox) checkLimit(limit int) error {
	if limit <= 0 {
		return fmt.Errorf("%s: delete expired: %w: limit must be positive", s.d.Name, repository.ErrInvalidParams)
	}
	return nil
}

// args checks the payload hash's size and encodes the times in vals.
func (s *Inbox) args(hash []byte, vals ...any) ([]any, error) {
	if s.d.MaxPayloadHash > 0 && len(hash) > s.d.MaxPayloadHash {
		return nil, fmt.Errorf("%w: PayloadHash is %d bytes, at most %d fit", repository.ErrInvalidParams, len(hash), s.d.MaxPayloadHash)
	}
	for i, v := range vals {
		if t, ok := v.(time.Time); ok {
			var err error
			if vals[i], err = s.d.EncodeTime(t); err != nil {
				return nil, err
			}
		}
	}
	return vals, nil
}

// write runs st on the pool, again while it is a deadlock victim.
func (s *Inbox) write(ctx context.Context, st Stmt, args ...any) (n int64, err error) {
	err = s.retry(func() error {
		n, err = st.exec(ctx, s.db, args...)
		return err
	})
	return n, err
}

// retry runs fn again while it fails with a retryable error, at most
// attempts times.
func (s *Inbox) retry(fn func() error) error {
	var err error
	for range attempts {
		if err = fn(); !s.d.isRetryable(err) {
			return err
		}
	}
	return err
}

// again reports whether an atomic operation that failed with err runs
// again (up to attempts times): its record vanished before it could be
// read, or it was a deadlock victim.
func (s *Inbox) again(err error) bool {
	return errors.Is(err, repository.ErrNotFound) || s.d.isRetryable(err)
}

func (s *Inbox) count(ctx context.Context, ex Executor, st Stmt, args ...any) (n int64, err error) {
	err = st.row(ctx, ex, args...).Scan(&n)
	return
}

// get reads one record, ErrNotFound if there is none.
func (s *Inbox) get(ctx context.Context, ex Executor, st Stmt, args ...any) (repository.Record, error) {
	rec, err := s.scan(st.row(ctx, ex, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return rec, repository.ErrNotFound
	}
	return rec, err
}

// scan reads the columns of one record; it is the one record scanner.
func (s *Inbox) scan(r Row) (repository.Record, error) {
	var (
		rec   repository.Record
		owner sql.NullString
		times = [4]timeColumn{{d: s.d}, {d: s.d}, {d: s.d}, {d: s.d}}
	)
	if err := r.Scan(&rec.Consumer, &rec.Key, &rec.State, &rec.PayloadHash, &rec.Result, &rec.Attempts,
		&owner, &times[0], &times[1], &times[2], &times[3]); err != nil {
		return repository.Record{}, err
	}
	rec.LeaseOwner = owner.String
	rec.LeaseUntil, rec.CreatedAt, rec.CompletedAt, rec.ExpiresAt = times[0].t, times[1].t, times[2].t, times[3].t
	return rec, nil
}

// timeColumn scans a nullable timestamp with the dialect's codec.
type timeColumn struct {
	d *Dialect
	t time.Time
}

func (c *timeColumn) Scan(v any) (err error) {
	c.t = time.Time{}
	switch t, ok := v.(time.Time); {
	case v == nil:
	case c.d.DecodeTime != nil:
		c.t, err = c.d.DecodeTime(v)
	case ok:
		c.t = t
	default:
		err = fmt.Errorf("cannot scan %T into a timestamp", v)
	}
	return err
}

// collect reads every row of a query with scan.
func collect[T any](ctx context.Context, ex Executor, st Stmt, scan func(Row) (T, error), args ...any) ([]T, error) {
	rows, err := ex.Query(ctx, st.text, st.Args(args...)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// contracts are the storage contracts both inbox stores implement, the
// plain table and the partitioned one.
type contracts interface {
	ClaimStore
	repository.TwoPhase
	repository.Reader
	repository.Cleaner
	repository.Operator
	repository.Stats
}

var (
	_ contracts = (*Inbox)(nil)
	_ contracts = (*PartitionedInbox)(nil)
)
