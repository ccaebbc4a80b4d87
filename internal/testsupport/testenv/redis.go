package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis environment variable and its default.
const (
	RedisEnv     = "REDIS_ADDR"
	RedisDefault = "127.0.0.1:6379"
)

// RedisAddr returns the Redis address tests use.
func RedisAddr() string { return getenv(RedisEnv, RedisDefault) }

// Redis connects to the test Redis server and closes the client when t
// ends. Tests share the server: give each its own key prefix (RedisPrefix).
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: RedisAddr()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		_ = client.Close()
		MissingAt(t, "Redis", RedisEnv, RedisAddr(), err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// RedisPrefix returns a key prefix no other test uses and deletes every
// key under it when t ends.
func RedisPrefix(t testing.TB, client redis.UniversalClient) string {
	t.Helper()
	prefix := "watermill-idempotent-test:" + randomHex() + ":"
	DeleteRedisKeysOnCleanup(t, client, prefix)
	return prefix
}

// DeleteRedisKeysOnCleanup deletes every key starting with prefix when t
// ends (SCAN on every master of a ClusterClient, or the one server, then
// pipelined DELs), and fails t if that does not work. prefix must not
// contain glob characters.
func DeleteRedisKeysOnCleanup(t testing.TB, client redis.UniversalClient, prefix string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		deleteUnder := func(ctx context.Context, node redis.Cmdable) error {
			iter := node.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			var batch []string
			flush := func() error {
				if len(batch) == 0 {
					return nil
				}
				// One DEL per key: on a cluster, keys of one batch live in many slots.
				_, err := client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
					for _, k := range batch {
						pipe.Del(ctx, k)
					}
					return nil
				})
				batch = batch[:0]
				return err
			}
			for iter.Next(ctx) {
				batch = append(batch, iter.Val())
				if len(batch) == 1000 {
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
		var err error
		if cluster, ok := client.(*redis.ClusterClient); ok {
			err = cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return deleteUnder(ctx, node) })
		} else {
			err = deleteUnder(ctx, client)
		}
		if err != nil {
			t.Errorf("redis cleanup of %s*: %v", prefix, err)
		}
	})
}
