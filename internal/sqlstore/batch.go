package sqlstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// maxBatchRows bounds the rows of one multi-row claim: 5 arguments a row
// stays far below every driver's limit on bound parameters (PostgreSQL
// and MySQL 65,535, SQLite 32,766).
const maxBatchRows = 1000

// ClaimBatchOn is ClaimBatchTx on any driver's transaction.
//
// Where the dialect ignores conflicts (PostgreSQL, SQLite) it is one
// INSERT … ON CONFLICT DO NOTHING RETURNING of every row, then one read
// per duplicate. On MySQL it is one plain multi-row INSERT: InnoDB rolls
// back just that statement on a duplicate key, and the rows are then
// claimed one by one with ClaimOn, in the same transaction.
func (s *Inbox) ClaimBatchOn(ctx context.Context, ex Executor, params []repository.ClaimParams) ([]repository.Claim, error) {
	rows, err := s.batchRows(params)
	if err != nil {
		return nil, err
	}
	claims := make([]repository.Claim, len(params))
	for chunk := range slices.Chunk(rows, maxBatchRows) {
		args := make([]any, 0, 5*len(chunk))
		for _, r := range chunk {
			args = append(args, r.args...)
		}
		claimed, err := s.insertBatch(ctx, ex, len(chunk), args)
		if err != nil {
			return nil, s.wrap("claim batch", err)
		}
		for _, r := range chunk {
			switch {
			case claimed == nil: // MySQL: a key of the chunk is taken
				c, err := s.ClaimOn(ctx, ex, params[r.i])
				if err != nil {
					return nil, err
				}
				claims[r.i] = c
			case claimed[[2]string{params[r.i].Consumer, r.key}]:
				claims[r.i] = repository.Claim{Claimed: true}
			default:
				rec, err := s.get(ctx, ex, s.q.lockedGet, r.args[0], r.args[1])
				if err != nil {
					return nil, s.wrap("read duplicate", fmt.Errorf("key %q: %w", params[r.i].Key, err))
				}
				claims[r.i] = repository.Claim{Existing: rec}
			}
		}
	}
	return claims, nil
}

// batchRowArgs is one row of a multi-row claim: params[i], its stored
// key and its five arguments.
type batchRowArgs struct {
	i    int
	key  string
	args []any
}

// batchRows validates params and returns their rows in the one lock order
// of every batch: concurrent batches with common keys wait for each other
// instead of deadlocking.
func (s *Inbox) batchRows(params []repository.ClaimParams) ([]batchRowArgs, error) {
	rows := make([]batchRowArgs, len(params))
	seen := make(map[[2]string]bool, len(params))
	for i, p := range params {
		key, err := batchRow(s.d, seen, i, p)
		if err != nil {
			return nil, err
		}
		args, err := s.args(p.PayloadHash, p.Consumer, key, p.PayloadHash, p.Now, p.ExpiresAt)
		if err != nil {
			return nil, fmt.Errorf("%s: claim batch: row %d: %w", s.d.Name, i, err)
		}
		rows[i] = batchRowArgs{i, key, args}
	}
	slices.SortFunc(rows, func(a, b batchRowArgs) int {
		return cmp.Or(strings.Compare(params[a.i].Consumer, params[b.i].Consumer), strings.Compare(a.key, b.key))
	})
	return rows, nil
}

// batchRow validates row i of a batch and returns its stored key. seen
// holds the (consumer, stored key) pairs of the rows before it: a pair
// given twice is refused with repository.ErrInvalidParams.
func batchRow(d *Dialect, seen map[[2]string]bool, i int, p repository.ClaimParams) (string, error) {
	if err := storekit.ValidateClaim(p); err != nil {
		return "", fmt.Errorf("%s: claim batch: row %d: %w", d.Name, i, err)
	}
	key := repository.StorageKey(p.Key)
	if seen[[2]string{p.Consumer, key}] {
		return "", fmt.Errorf("%s: claim batch: %w: (%q, %q) twice in one batch", d.Name, repository.ErrInvalidParams, p.Consumer, p.Key)
	}
	seen[[2]string{p.Consumer, key}] = true
	return key, nil
}

// insertBatch inserts n claim rows of args (5 each) and returns the
// (consumer, stored key) pairs it inserted; nil when the dialect cannot
// tell and a key was taken (MySQL: nothing of the statement stays).
func (s *Inbox) insertBatch(ctx context.Context, ex Executor, n int, args []any) (map[[2]string]bool, error) {
	st := s.batchInsert(n)
	claimed := make(map[[2]string]bool, n)
	if !strings.Contains(st.text, "RETURNING") {
		_, err := st.exec(ctx, ex, args...)
		if s.d.isUniqueViolation(err) {
			return nil, nil
		}
		for r := range n {
			claimed[[2]string{args[5*r].(string), args[5*r+1].(string)}] = true
		}
		return claimed, err
	}
	got, err := collect(ctx, ex, st, func(r Row) ([2]string, error) {
		var k [2]string
		return k, r.Scan(&k[0], &k[1])
	}, args...)
	for _, k := range got {
		claimed[k] = true
	}
	return claimed, err
}

// batchStmtKey is a multi-row claim in Inbox.batches: binding one costs
// more than the claim's own work in Go.
type batchStmtKey struct{ rows int }

// batchInsert is the dialect's ClaimBatch for n rows, its VALUES row
// repeated.
func (s *Inbox) batchInsert(n int) Stmt {
	k := batchStmtKey{n}
	if st, ok := s.batches.Load(k); ok {
		return st.(Stmt)
	}
	st := s.d.Bound(s.t.quoted, s.d.Repeat(s.d.Inbox.ClaimBatch, n, 5))
	s.batches.Store(k, st)
	return st
}

// RetryableTx is repository.Driver's Retryable: the dialect's
// deadlock victim, or a serialization failure (SQLSTATE 40001).
func (s *Inbox) RetryableTx(err error) bool {
	if err == nil {
		return false
	}
	return s.d.isRetryable(err) || storekit.IsSerializationFailure(err)
}
