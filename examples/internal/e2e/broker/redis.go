package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"
)

// Redis Streams timing. A message a consumer read and never acknowledged
// stays in the group's pending entries list; another consumer claims it
// (XCLAIM) once it has been idle for redisMaxIdle, checking every
// redisClaimInterval. That claim is the only redelivery after a crash:
// keep redisMaxIdle above the longest handler run (a slower one is
// claimed while it runs, a duplicate the inbox absorbs).
const (
	redisMaxIdle       = 3 * time.Second
	redisClaimInterval = 250 * time.Millisecond
)

func newRedisClient(config Config) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: config.RedisAddr})
}

// newRedisPublisher returns a publisher with its own client: XADD to a
// stream per topic. Closing it closes the client.
func newRedisPublisher(config Config, logger watermill.LoggerAdapter) (*redisstream.Publisher, error) {
	return redisstream.NewPublisher(redisstream.PublisherConfig{Client: newRedisClient(config)}, logger)
}

// newRedisSubscriber returns a consumer of the group (a Redis consumer
// group per topic and group, created at the stream's start, "0", so
// messages published before the group existed are read) with its own
// client and a random consumer name. A handler error makes it resend the
// message to the handler at once (watermill-redisstream's nack).
func newRedisSubscriber(config Config, group string, logger watermill.LoggerAdapter) (*redisstream.Subscriber, error) {
	return redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        newRedisClient(config),
		ConsumerGroup:                 group,
		OldestId:                      "0",
		MaxIdleTime:                   redisMaxIdle,
		ClaimInterval:                 redisClaimInterval,
		BlockTime:                     50 * time.Millisecond,
		DisableIndefiniteInitialBlock: true,
	}, logger)
}

// deleteRedisStreams deletes the streams named after topics, with their
// consumer groups.
func deleteRedisStreams(ctx context.Context, config Config, topics []string) error {
	client := newRedisClient(config)
	defer client.Close()
	if err := client.Del(ctx, topics...).Err(); err != nil {
		return fmt.Errorf("redis cleanup: %w", err)
	}
	return nil
}
