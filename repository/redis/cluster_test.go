package redis_test

import (
	"testing"

	"github.com/idemkit/watermill-idempotent/internal/testenv"
	"github.com/idemkit/watermill-idempotent/repository/redis"
	"github.com/idemkit/watermill-idempotent/repository/repotest"
)

// TestClusterConformance runs the whole conformance suite through a
// go-redis ClusterClient on a cluster of 3 primaries and 3 replicas: the
// records of one case spread over every primary's slots, so the Operator
// and Stats cases fail if ListStuck or CountRecords miss a node.
func TestClusterConformance(t *testing.T) {
	client := testenv.RedisCluster(t)
	repotest.Run(t, repotest.Backend{
		Name:     "redis-cluster",
		Features: repotest.Features{TwoPhase: true, NoSQLTable: true, ExpiryByTTL: true, Operator: true, Stats: true},
		New: func(t *testing.T, table string) (repotest.Repository, error) {
			prefix := "watermill-idempotent-test:" + table + ":"
			testenv.DeleteRedisKeysOnCleanup(t, client, prefix)
			return redis.NewRepository(client, redis.Config{KeyPrefix: prefix})
		},
	})
}
