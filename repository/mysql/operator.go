package mysql

import (
	"context"
	"database/sql"

	"github.com/idemkit/watermill-idempotent/internal/sqlrepo"
	"github.com/idemkit/watermill-idempotent/repository"
)

// operatorSQL holds the statements of repository.Operator.
type operatorSQL struct {
	list, complete, release, exists string
}

func newOperatorSQL(t string) operatorSQL {
	const fenced = ` WHERE consumer = ? AND dedup_key = ? AND state = 'in_progress' AND lease_owner = ? AND lease_until <= ? AND expires_at > ?`
	return operatorSQL{
		list: `SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM ` + t + ` WHERE state = 'in_progress' AND lease_until <= ? AND expires_at > ? AND (? = '' OR consumer = ?)
ORDER BY lease_until, consumer, dedup_key LIMIT ?`,
		complete: `UPDATE ` + t + ` SET state = 'completed', result = ?, completed_at = ?` + fenced,
		release:  `DELETE FROM ` + t + fenced,
		exists:   `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ? AND dedup_key = ? AND expires_at > ?`,
	}
}

// ListStuck implements repository.Operator with one SELECT. The inbox
// table has no index on state or lease, so it scans the table: an
// operator's query, not one for the hot path. It reads without locking.
func (r *Repository) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	p, err := repository.ValidateListStuck(p)
	if err != nil {
		return nil, err
	}
	now, err := datetime("Now", p.Now)
	if err != nil {
		return nil, err
	}
	rows, err := r.db.QueryContext(ctx, newOperatorSQL(r.table).list, now, now, p.Consumer, p.Consumer, p.Limit)
	return sqlrepo.Records("mysql", "list stuck", rows, err, scanRecord)
}

// Resolve implements repository.Operator with one UPDATE (complete) or
// DELETE (release) fenced by state, owner, expired lease and record
// expiry; the UPDATE always changes the state, so its affected-row count
// does not depend on the DSN's clientFoundRows. When it matches no row, a
// second read tells repository.ErrNotFound from repository.ErrLeaseLost.
// A statement picked as a deadlock victim runs again (it is atomic).
func (r *Repository) Resolve(ctx context.Context, p repository.ResolveParams) error {
	if err := repository.ValidateResolve(p); err != nil {
		return err
	}
	now, err := datetime("Now", p.Now)
	if err != nil {
		return err
	}
	op := newOperatorSQL(r.table)
	var (
		query string
		args  []any
	)
	switch p.Action {
	case repository.ResolveComplete:
		query, args = op.complete, []any{p.Result, now, p.Consumer, p.Key, p.ExpectedOwner, now, now}
	default:
		query, args = op.release, []any{p.Consumer, p.Key, p.ExpectedOwner, now, now}
	}
	var res sql.Result
	for range attempts {
		if res, err = r.db.ExecContext(ctx, query, args...); !isDeadlock(err) {
			break
		}
	}
	return sqlrepo.Resolved(ctx, r.db, "mysql", p, res, err, op.exists, p.Consumer, p.Key, now)
}

// scanRecord reads one row of the record columns from a multi-row query.
func scanRecord(rows *sql.Rows) (repository.Record, error) {
	var (
		rec                                           repository.Record
		state                                         string
		owner                                         sql.NullString
		leaseUntil, createdAt, completedAt, expiresAt utcTime
	)
	if err := rows.Scan(&rec.Consumer, &rec.Key, &state, &rec.PayloadHash, &rec.Result, &rec.Attempts,
		&owner, &leaseUntil, &createdAt, &completedAt, &expiresAt); err != nil {
		return repository.Record{}, err
	}
	rec.State = repository.State(state)
	rec.LeaseOwner = owner.String
	rec.LeaseUntil = leaseUntil.Time
	rec.CreatedAt = createdAt.Time
	rec.CompletedAt = completedAt.Time
	rec.ExpiresAt = expiresAt.Time
	return rec, nil
}

var _ repository.Operator = (*Repository)(nil)
