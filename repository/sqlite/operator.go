package sqlite

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
	const fenced = ` WHERE consumer = ?1 AND dedup_key = ?2 AND state = 'in_progress' AND lease_owner = ?3 AND lease_until <= ?4 AND expires_at > ?4`
	return operatorSQL{
		list: `SELECT consumer, dedup_key, state, payload_hash, result, attempts, lease_owner, lease_until, created_at, completed_at, expires_at
FROM ` + t + ` WHERE state = 'in_progress' AND lease_until <= ?1 AND expires_at > ?1 AND (?2 = '' OR consumer = ?2)
ORDER BY lease_until, consumer, dedup_key LIMIT ?3`,
		complete: `UPDATE ` + t + ` SET state = 'completed', result = ?5, completed_at = ?4` + fenced,
		release:  `DELETE FROM ` + t + fenced,
		exists:   `SELECT COUNT(*) FROM ` + t + ` WHERE consumer = ?1 AND dedup_key = ?2 AND expires_at > ?3`,
	}
}

// ListStuck implements repository.Operator with one SELECT. The inbox
// table has no index on state or lease, so it scans the table: an
// operator's query, not one for the hot path.
func (r *Repository) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	p, err := repository.ValidateListStuck(p)
	if err != nil {
		return nil, err
	}
	rows, err := r.db.QueryContext(ctx, newOperatorSQL(r.table).list, micros(p.Now), p.Consumer, p.Limit)
	return sqlrepo.Records("sqlite", "list stuck", rows, err, scanRecord)
}

// Resolve implements repository.Operator with one UPDATE (complete) or
// DELETE (release) fenced by state, owner, expired lease and record
// expiry. When it matches no row, a second read tells repository.ErrNotFound
// from repository.ErrLeaseLost.
func (r *Repository) Resolve(ctx context.Context, p repository.ResolveParams) error {
	if err := repository.ValidateResolve(p); err != nil {
		return err
	}
	op := newOperatorSQL(r.table)
	now := micros(p.Now)
	var (
		res sql.Result
		err error
	)
	switch p.Action {
	case repository.ResolveComplete:
		res, err = r.db.ExecContext(ctx, op.complete, p.Consumer, p.Key, p.ExpectedOwner, now, p.Result)
	default:
		res, err = r.db.ExecContext(ctx, op.release, p.Consumer, p.Key, p.ExpectedOwner, now)
	}
	return sqlrepo.Resolved(ctx, r.db, "sqlite", p, res, err, op.exists, p.Consumer, p.Key, now)
}

// scanRecord reads one row of the record columns from a multi-row query.
func scanRecord(rows *sql.Rows) (repository.Record, error) {
	var (
		rec                                repository.Record
		state                              string
		owner                              sql.NullString
		leaseUntil, createdAt, completedAt sql.NullInt64
		expiresAt                          sql.NullInt64
	)
	if err := rows.Scan(&rec.Consumer, &rec.Key, &state, &rec.PayloadHash, &rec.Result, &rec.Attempts,
		&owner, &leaseUntil, &createdAt, &completedAt, &expiresAt); err != nil {
		return repository.Record{}, err
	}
	rec.State = repository.State(state)
	rec.LeaseOwner = owner.String
	rec.LeaseUntil = fromMicros(leaseUntil)
	rec.CreatedAt = fromMicros(createdAt)
	rec.CompletedAt = fromMicros(completedAt)
	rec.ExpiresAt = fromMicros(expiresAt)
	return rec, nil
}

var _ repository.Operator = (*Repository)(nil)
