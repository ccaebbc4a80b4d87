package mysql

import (
	"context"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/sqlrepo"
	"github.com/idemkit/watermill-idempotent/repository"
)

// countRecordsSQL counts the live records of every consumer by state in
// one pass over the table; every placeholder is the sample's time.
// consumer is VARBINARY, so GROUP BY and ORDER BY compare bytes.
func countRecordsSQL(t string) string {
	return `SELECT consumer,
	COALESCE(SUM(state = 'in_progress' AND lease_until > ?), 0),
	COALESCE(SUM(state = 'in_progress' AND lease_until <= ?), 0),
	COALESCE(SUM(state = 'completed'), 0)
FROM ` + t + ` WHERE expires_at > ?
GROUP BY consumer ORDER BY consumer`
}

// CountRecords implements repository.Stats with one aggregate SELECT, an
// InnoDB consistent read that takes no locks. The inbox table has no
// index on state or lease, so it scans the table (the primary key): run
// it at janitor intervals, not per message.
func (r *Repository) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	if err := repository.ValidateCountRecords(now); err != nil {
		return nil, err
	}
	at, err := datetime("now", now)
	if err != nil {
		return nil, err
	}
	rows, err := r.db.QueryContext(ctx, countRecordsSQL(r.table), at, at, at)
	return sqlrepo.RecordCounts("mysql", rows, err)
}

var _ repository.Stats = (*Repository)(nil)
