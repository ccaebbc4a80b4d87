package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// CountRecords implements repository.Stats by walking the key space under
// the prefix with SCAN (COUNT scanBatch) and reading four fields of each
// record (consumer, state, lease_until, expires_at) with pipelined HMGETs,
// one round trip per batch. Its cost grows with the number of records
// under the prefix — about two round trips per 500 records, and the
// server's SCAN work over the whole database: run it at janitor
// intervals, not per message. SCAN does not block the server, but the
// walk is not a snapshot: a record written or deleted during it may be
// counted or not. Over a *redis.ClusterClient it walks every master
// (ForEachMaster), over a *redis.Ring every shard, so the counts cover
// the whole cluster; during a failover a record may be missed or counted
// twice.
func (r *Repository) CountRecords(ctx context.Context, now time.Time) ([]repository.RecordCount, error) {
	if err := storekit.ValidateCountRecords(now); err != nil {
		return nil, err
	}
	us := micros(now)
	byConsumer := make(map[string]*repository.RecordCount)
	hmget := func(pipe goredis.Pipeliner, k string) {
		pipe.HMGet(ctx, k, "consumer", "state", "lease_until", "expires_at")
	}
	err := r.scanEach(ctx, globEscaper.Replace(r.prefix)+"{*", hmget, func(_ string, cmd goredis.Cmder) error {
		v, err := cmd.(*goredis.SliceCmd).Result()
		if err != nil {
			return err
		}
		consumer, ok := v[0].(string)
		if !ok { // deleted since the SCAN saw it
			return nil
		}
		state, _ := v[1].(string)
		leaseUntil, err := microsField(v[2])
		if err != nil {
			return fmt.Errorf("malformed record: lease_until: %w", err)
		}
		expiresAt, err := microsField(v[3])
		if err != nil {
			return fmt.Errorf("malformed record: expires_at: %w", err)
		}
		if expiresAt <= us { // the TTL is due: the scripts treat it as absent
			return nil
		}
		c := byConsumer[consumer]
		if c == nil {
			c = &repository.RecordCount{Consumer: consumer}
			byConsumer[consumer] = c
		}
		switch {
		case repository.State(state) == repository.StateCompleted:
			c.Completed++
		case leaseUntil > us:
			c.InProgress++
		default:
			c.Stale++
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis: count records: %w", err)
	}
	counts := make([]repository.RecordCount, 0, len(byConsumer))
	for _, c := range byConsumer {
		counts = append(counts, *c)
	}
	slices.SortFunc(counts, func(a, b repository.RecordCount) int { return strings.Compare(a.Consumer, b.Consumer) })
	return counts, nil
}

// microsField parses a timestamp field read by HMGET; a missing field
// reads as 0.
func microsField(v any) (int64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

var _ repository.Stats = (*Repository)(nil)
