// Package redis is the Redis backend of the inbox, on go-redis v9. Redis
// cannot join a SQL transaction, so it implements the two-phase contract
// (repository.TwoPhase) plus repository.Reader and repository.Cleaner.
//
//	client := goredis.NewClient(&goredis.Options{Addr: "localhost:6379"})
//	repo, err := redis.NewRepository(client, redis.Config{KeyPrefix: "billing-inbox:"})
//	if err != nil { … }
//	a, err := repo.Acquire(ctx, repository.AcquireParams{
//		Consumer: "billing", Key: msg.UUID, PayloadHash: repository.HashPayload(msg.Payload),
//		Owner: watermill.NewUUID(), Now: now,
//		LeaseUntil: now.Add(30 * time.Second), ExpiresAt: now.Add(7 * 24 * time.Hour),
//	})
//
// # Atomicity
//
// Every state change — acquire, reclaim, extend, complete, release — is one
// Lua script (EVALSHA) that reads the record's fields, checks state, owner
// and lease, and writes, all inside Redis's single-threaded execution: no
// other command runs in between, so there is never a read in Go followed
// by a write. Racing acquires or reclaims of one key are decided by which
// script Redis runs first.
//
// # Key layout and Redis Cluster
//
// One Redis hash per record, at
//
//	<KeyPrefix>{<consumer>:<storage key>}
//
// where the storage key is repository.StorageKey(key) (long keys are
// hashed) and ':', '{', '}' and '%' in the consumer are percent-escaped, so
// two (consumer, key) pairs never share a Redis key. Each script touches
// only its record's key, and the braces make that key's Cluster hash slot
// depend only on the record's identity, not on the prefix: records spread
// over the cluster, and any key a future version adds for the same record
// lands in the same slot. The prefix may not contain braces. See
// Repository.RecordKey. ListStuck and CountRecords (and so the janitor's
// record gauges) walk every primary of a *redis.ClusterClient
// (ForEachMaster) and every shard of a *redis.Ring.
//
// # Expiry and clocks
//
// Record expiry uses Redis TTL: Acquire sets PEXPIREAT to ExpiresAt, so
// Redis deletes the record by itself, judged by the Redis server's clock.
// DeleteExpired is a no-op that returns 0. Leases, in contrast, are judged
// by the caller's clock: lease_until is stored as a field and compared
// with the Now the caller passes to the script, as on every other backend.
// Keep the clocks of consumers and the Redis server synchronized (NTP):
// a skew between consumers shifts when a lease counts as expired, a skew
// with the server shifts when records disappear — make retention much
// longer than any plausible skew. The scripts also treat a record whose
// expires_at is not after the caller's Now as absent, so expiry looks the
// same from both clocks' side.
//
// Durability is Redis's. Without AOF (appendonly no) a restart loses
// every record: completed keys are processed again on redelivery, and an
// in-flight lease vanishes, so a second attempt runs the effect while the
// first may still be running — the Intervene policy cannot stop it.
// Run Redis with appendonly yes (appendfsync always to lose nothing
// acknowledged on a power loss, everysec to risk about a second) and
// maxmemory-policy noeviction (every record has a TTL, so the volatile
// policies would evict markers). A failover to an asynchronous replica can
// still lose the latest records — those its primary acknowledged but had
// not yet streamed (the replication lag). docs/storage.md has the
// measured cost of persistence, docs/scaling.md the cluster failover
// measurement.
//
// # Durable writes
//
// Config.DurableWrites closes that window: every state change is followed
// by WAIT on the same connection to the record's primary, and returns only
// once that many replicas have it — or an error wrapping ErrNotDurable
// after Config.DurableTimeout. A failover that promotes one of those
// replicas then keeps every acknowledged write (measured in
// docs/operations.md: 0 lost, against hundreds to thousands without it
// when the replica lagged). The price is a round trip to a replica per
// write, and availability: with one replica per primary, a primary whose
// replica is down or lagging fails every write until it is back. A read
// does not wait: a record that a write failed with ErrNotDurable left on
// the primary is seen by the next Acquire or Get before the replica has
// it.
//
//	repo, err := redis.NewRepository(client, redis.Config{DurableWrites: 1})
package redis
