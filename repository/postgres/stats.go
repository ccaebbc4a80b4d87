package postgres

import (
	"context"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/sqlrepo"
	"github.com/idemkit/watermill-idempotent/repository"
)

// countRecordsSQL counts the live records of every consumer by state in
// one pass over the table; $1 is the sample's time.
func countRecordsSQL(t string) string {
	return `SELECT consumer,
	COUNT(*) FILTER (WHERE state = 'in_progress' AND lease_until > $1),
	COUNT(*) FILTER (WHERE state = 'in_progress' AND lease_until <= $1),
	COUNT(*) FILTER (WHERE state = 'completed')
FROM ` + t + ` WHERE expires_at > $1
GROUP BY consumer ORDER BY consumer COLLATE "C"`
}

// CountRecords implements repository.Stats with one aggregate SELECT,
// a consistent snapshot that takes no row locks. The inbox table has no
// index on state or lease, so it scans the table (a sequential scan of
// every row, expired ones included): run it at janitor intervals, not
// per message.
func (r *Repository) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	if err := repository.ValidateCountRecords(now); err != nil {
		return nil, err
	}
	rows, err := r.db.QueryContext(ctx, countRecordsSQL(r.table), now.UTC())
	return sqlrepo.RecordCounts("postgres", rows, err)
}

var _ repository.Stats = (*Repository)(nil)
