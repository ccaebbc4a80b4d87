package redis

import (
	"context"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// scanKeys walks every key matching the SCAN pattern match on every node
// that holds records — each master of a *redis.ClusterClient, each shard
// of a *redis.Ring, the one server otherwise — and calls fn with batches
// of at most scanBatch keys. A SCAN through a ClusterClient alone would
// walk one node and miss the records in every other master's slots. The
// nodes are walked concurrently (ForEachMaster, ForEachShard) but fn is
// never called concurrently; fn reads the keys through the repository's
// client, which routes each key to its slot's master. The walk is not a
// snapshot, and on a cluster that is failing over or resharding a key may
// be seen twice or not at all.
func (r *Repository) scanKeys(ctx context.Context, match string, fn func(keys []string) error) error {
	var mu sync.Mutex
	walk := func(ctx context.Context, node goredis.Cmdable) error {
		batch := make([]string, 0, scanBatch)
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			mu.Lock()
			defer mu.Unlock()
			err := fn(batch)
			batch = batch[:0]
			return err
		}
		iter := node.Scan(ctx, 0, match, scanBatch).Iterator()
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == scanBatch {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		return flush()
	}
	eachNode := func(ctx context.Context, node *goredis.Client) error { return walk(ctx, node) }
	switch c := r.client.(type) {
	case *goredis.ClusterClient:
		return c.ForEachMaster(ctx, eachNode)
	case *goredis.Ring:
		return c.ForEachShard(ctx, eachNode)
	default: // one server, or a wrapper: what its own SCAN sees
		return walk(ctx, r.client)
	}
}
