package memory

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// CountRecords implements repository.Stats. It walks every record under
// the mutex — a consistent snapshot that holds up other calls for the
// length of the walk.
func (r *Repository) CountRecords(_ context.Context, now time.Time) ([]repository.RecordCount, error) {
	if err := storekit.ValidateCountRecords(now); err != nil {
		return nil, err
	}
	now = at(now)
	byConsumer := make(map[string]*repository.RecordCount)
	r.mu.Lock()
	for id, rec := range r.records {
		if !rec.ExpiresAt.After(now) {
			continue
		}
		c := byConsumer[id.consumer]
		if c == nil {
			c = &repository.RecordCount{Consumer: id.consumer}
			byConsumer[id.consumer] = c
		}
		switch {
		case rec.State == repository.StateCompleted:
			c.Completed++
		case rec.LeaseUntil.After(now):
			c.InProgress++
		default:
			c.Stale++
		}
	}
	r.mu.Unlock()
	counts := make([]repository.RecordCount, 0, len(byConsumer))
	for _, c := range byConsumer {
		counts = append(counts, *c)
	}
	slices.SortFunc(counts, func(a, b repository.RecordCount) int { return strings.Compare(a.Consumer, b.Consumer) })
	return counts, nil
}

var _ repository.Stats = (*Repository)(nil)
