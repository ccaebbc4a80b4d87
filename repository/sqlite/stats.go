package sqlite

import (
	"context"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/sqlrepo"
	"github.com/idemkit/watermill-idempotent/repository"
)

// countRecordsSQL counts the live records of every consumer by state in
// one pass over the table; ?1 is the sample's time in microseconds.
func countRecordsSQL(t string) string {
	return `SELECT consumer,
	COALESCE(SUM(state = 'in_progress' AND lease_until > ?1), 0),
	COALESCE(SUM(state = 'in_progress' AND lease_until <= ?1), 0),
	COALESCE(SUM(state = 'completed'), 0)
FROM ` + t + ` WHERE expires_at > ?1
GROUP BY consumer ORDER BY consumer`
}

// CountRecords implements repository.Stats with one aggregate SELECT, a
// consistent snapshot (a read transaction: it does not take the write
// lock, so claims go on). The inbox table has no index on state or lease,
// so it scans the table: run it at janitor intervals, not per message.
func (r *Repository) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	if err := repository.ValidateCountRecords(now); err != nil {
		return nil, err
	}
	rows, err := r.db.QueryContext(ctx, countRecordsSQL(r.table), micros(now))
	return sqlrepo.RecordCounts("sqlite", rows, err)
}

var _ repository.Stats = (*Repository)(nil)
