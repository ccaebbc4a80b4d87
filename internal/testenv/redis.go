package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
		Missing(t, "Redis ("+RedisEnv+"="+RedisAddr()+")", err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// RedisPrefix returns a key prefix no other test uses and deletes every
// key under it when t ends.
func RedisPrefix(t testing.TB, client *redis.Client) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	prefix := "watermill-idempotent-test:" + hex.EncodeToString(b[:]) + ":"
	DeleteRedisKeysOnCleanup(t, client, prefix)
	return prefix
}

// DeleteRedisKeysOnCleanup deletes every key starting with prefix when t
// ends (SCAN, then DEL in batches), and fails t if that does not work.
// prefix must not contain glob characters.
func DeleteRedisKeysOnCleanup(t testing.TB, client *redis.Client, prefix string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var batch []string
		flush := func() {
			if len(batch) > 0 {
				if err := client.Del(ctx, batch...).Err(); err != nil {
					t.Errorf("redis cleanup of %s*: %v", prefix, err)
				}
				batch = batch[:0]
			}
		}
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 1000 {
				flush()
			}
		}
		flush()
		if err := iter.Err(); err != nil {
			t.Errorf("redis cleanup of %s*: %v", prefix, err)
		}
	})
}
