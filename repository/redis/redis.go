package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// DefaultKeyPrefix is the key prefix used when none is configured.
const DefaultKeyPrefix = "watermill_inbox:"

// MaxKeyPrefixLength is the longest accepted key prefix, in bytes.
const MaxKeyPrefixLength = 255

// ErrInvalidKeyPrefix is returned by NewRepository and Config.Validate for
// a key prefix containing '{' or '}' (it would move every record into the
// prefix's Cluster hash slot) or longer than MaxKeyPrefixLength.
var ErrInvalidKeyPrefix = errors.New("invalid redis key prefix")

// Config configures a Repository.
type Config struct {
	// KeyPrefix starts every record's Redis key, so several inboxes (or
	// other data) can share a Redis database. Default: DefaultKeyPrefix.
	// It must not contain '{' or '}'.
	KeyPrefix string

	// DurableWrites is how many replicas must acknowledge each state
	// change (Acquire, Reclaim, Extend, Complete, Release, Resolve)
	// before it returns: the write is followed by WAIT DurableWrites
	// DurableTimeout on the same connection to the record's primary. A
	// write fewer replicas acknowledged in time returns an error wrapping
	// ErrNotDurable. Default 0: no WAIT, a write returns once its primary
	// has it (Redis replicates asynchronously, so a failover can lose
	// it). It must not be negative. The client must be a *redis.Client
	// (also a Sentinel failover client), a *redis.ClusterClient or a
	// *redis.Ring. Through a ClusterClient the write goes straight to the
	// primary of the key's slot: it follows MOVED (a failover), but not
	// ASK, so during a resharding a write to a key already migrated fails
	// until its slot has moved.
	DurableWrites int
	// DurableTimeout is how long a write waits for the DurableWrites
	// replicas. Default DefaultDurableTimeout; it must not be negative,
	// nor shorter than a millisecond (WAIT's unit; 0 would wait forever).
	// Unused when DurableWrites is 0.
	DurableTimeout time.Duration
}

// DefaultDurableTimeout is Config.DurableTimeout's default.
const DefaultDurableTimeout = time.Second

func (c *Config) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.DurableTimeout == 0 {
		c.DurableTimeout = DefaultDurableTimeout
	}
}

// Validate reports whether the configuration is usable. Errors about the
// prefix wrap ErrInvalidKeyPrefix; every error names its field, and all
// are reported, joined.
func (c Config) Validate() error {
	var errs []error
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		errs = append(errs, fmt.Errorf("%w: %q contains a brace", ErrInvalidKeyPrefix, c.KeyPrefix))
	}
	if len(c.KeyPrefix) > MaxKeyPrefixLength {
		errs = append(errs, fmt.Errorf("%w: longer than %d bytes", ErrInvalidKeyPrefix, MaxKeyPrefixLength))
	}
	if c.DurableWrites < 0 {
		errs = append(errs, fmt.Errorf("config.DurableWrites (%d) is negative: set the number of replicas to wait for, or 0 for none", c.DurableWrites))
	}
	if c.DurableTimeout < 0 {
		errs = append(errs, fmt.Errorf("config.DurableTimeout (%s) is negative", c.DurableTimeout))
	} else if c.DurableTimeout > 0 && c.DurableTimeout < time.Millisecond {
		errs = append(errs, fmt.Errorf("config.DurableTimeout (%s) is shorter than WAIT's millisecond", c.DurableTimeout))
	}
	return errors.Join(errs...)
}

// Repository stores inbox records in Redis, one hash per record. It
// implements repository.TwoPhase, repository.Reader and
// repository.Cleaner and is safe for concurrent use. Every state change
// is one Lua script, atomic on the server (see the package
// documentation for the key layout, expiry and clock assumptions); with
// Config.DurableWrites a script that changed the record is followed by
// WAIT, and an error wrapping ErrNotDurable reports a change the replicas
// did not acknowledge in time.
type Repository struct {
	client goredis.UniversalClient
	prefix string
	// durable and durableTimeout are Config.DurableWrites and
	// DurableTimeout; primaryFor finds the client of a key's primary when
	// durable > 0.
	durable        int
	durableTimeout time.Duration
	primaryFor     func(ctx context.Context, key string) (*goredis.Client, error)
}

// NewRepository returns a Repository over client (a *redis.Client, a
// *redis.ClusterClient or any redis.UniversalClient; with
// Config.DurableWrites one of *redis.Client, *redis.ClusterClient and
// *redis.Ring). It needs no schema.
func NewRepository(client goredis.UniversalClient, config Config) (*Repository, error) {
	if client == nil {
		return nil, errors.New("redis: client is nil")
	}
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	r := &Repository{client: client, prefix: config.KeyPrefix, durable: config.DurableWrites, durableTimeout: config.DurableTimeout}
	if r.durable > 0 {
		var err error
		if r.primaryFor, err = primaryFinder(client); err != nil {
			return nil, fmt.Errorf("redis: config.DurableWrites: %w", err)
		}
	}
	return r, nil
}

var consumerEscaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

// RecordKey returns the Redis key holding the record of (consumer, key):
// KeyPrefix + "{" + escaped consumer + ":" + repository.StorageKey(key) +
// "}". Distinct (consumer, key) pairs always get distinct Redis keys.
func (r *Repository) RecordKey(consumer, key string) string {
	return r.prefix + "{" + consumerEscaper.Replace(consumer) + ":" + repository.StorageKey(key) + "}"
}

func micros(t time.Time) int64 { return t.UnixMicro() }

func flag(b []byte) string {
	if b == nil {
		return "0"
	}
	return "1"
}

// Acquire implements repository.TwoPhase with one Lua script: if no live
// record exists it writes the in_progress record and sets its TTL
// (PEXPIREAT ExpiresAt), otherwise it returns the stored record. A record
// whose ExpiresAt is not after Now counts as absent and is replaced.
func (r *Repository) Acquire(ctx context.Context, p repository.AcquireParams) (repository.Acquisition, error) {
	if err := storekit.ValidateAcquire(p); err != nil {
		return repository.Acquisition{}, err
	}
	v, err := r.run(ctx, acquireScript, r.RecordKey(p.Consumer, p.Key), replyIsOne,
		p.Consumer, repository.StorageKey(p.Key), p.PayloadHash, flag(p.PayloadHash), p.Owner,
		micros(p.Now), micros(p.LeaseUntil), micros(p.ExpiresAt), p.ExpiresAt.UnixMilli())
	if err != nil {
		return repository.Acquisition{}, fmt.Errorf("redis: acquire: %w", err)
	}
	if n, ok := v.(int64); ok && n == 1 {
		return repository.Acquisition{Acquired: true}, nil
	}
	rec, err := parseRecord(v)
	if err != nil {
		return repository.Acquisition{}, fmt.Errorf("redis: acquire: %w", err)
	}
	return repository.Acquisition{Existing: rec}, nil
}

// Reclaim implements repository.TwoPhase with one Lua script that checks
// state, previous owner, lease expiry at Now and record expiry, then
// moves the lease and increments Attempts. Racing reclaims run one after
// the other on the server; all but the first get repository.ErrLeaseLost.
func (r *Repository) Reclaim(ctx context.Context, p repository.ReclaimParams) (repository.Record, error) {
	if err := storekit.ValidateReclaim(p); err != nil {
		return repository.Record{}, err
	}
	v, err := r.run(ctx, reclaimScript, r.RecordKey(p.Consumer, p.Key), replyIsRecord,
		p.PrevOwner, p.Owner, micros(p.Now), micros(p.LeaseUntil))
	if err != nil {
		return repository.Record{}, fmt.Errorf("redis: reclaim: %w", err)
	}
	if n, ok := v.(int64); ok && n == 0 {
		return repository.Record{}, fmt.Errorf("redis: reclaim: %w", repository.ErrLeaseLost)
	}
	rec, err := parseRecord(v)
	if err != nil {
		return repository.Record{}, fmt.Errorf("redis: reclaim: %w", err)
	}
	return rec, nil
}

// Extend implements repository.TwoPhase with one Lua script. It does not
// change the record's TTL.
func (r *Repository) Extend(ctx context.Context, p repository.LeaseParams) error {
	if err := storekit.ValidateExtend(p); err != nil {
		return err
	}
	return r.fenced(ctx, "extend", extendScript, p.Consumer, p.Key, p.Owner, micros(p.LeaseUntil))
}

// Complete implements repository.TwoPhase with one Lua script. The record
// keeps its TTL: it expires at the ExpiresAt given to Acquire.
func (r *Repository) Complete(ctx context.Context, p repository.CompleteParams) error {
	if err := storekit.ValidateComplete(p); err != nil {
		return err
	}
	return r.fenced(ctx, "complete", completeScript, p.Consumer, p.Key, p.Owner, micros(p.Now), p.Result, flag(p.Result))
}

// Release implements repository.TwoPhase with one Lua script that deletes
// the record.
func (r *Repository) Release(ctx context.Context, p repository.LeaseParams) error {
	if err := storekit.ValidateRelease(p); err != nil {
		return err
	}
	return r.fenced(ctx, "release", releaseScript, p.Consumer, p.Key, p.Owner)
}

// fenced runs a script that starts with the fence and reports
// repository.ErrLeaseLost when the fence stopped it.
func (r *Repository) fenced(ctx context.Context, op string, s *goredis.Script, consumer, key, owner string, args ...any) error {
	v, err := r.run(ctx, s, r.RecordKey(consumer, key), replyIsOne, append([]any{owner}, args...)...)
	if err != nil {
		return fmt.Errorf("redis: %s: %w", op, err)
	}
	if n, ok := v.(int64); !ok {
		return fmt.Errorf("redis: %s: unexpected script reply %T %v", op, v, v)
	} else if n == 0 {
		return fmt.Errorf("redis: %s: %w", op, repository.ErrLeaseLost)
	}
	return nil
}

// Get implements repository.Reader with one HGETALL.
func (r *Repository) Get(ctx context.Context, consumer, key string) (repository.Record, error) {
	if err := storekit.ValidateGet(consumer, key); err != nil {
		return repository.Record{}, err
	}
	m, err := r.client.HGetAll(ctx, r.RecordKey(consumer, key)).Result()
	if err != nil {
		return repository.Record{}, fmt.Errorf("redis: get: %w", err)
	}
	if len(m) == 0 {
		return repository.Record{}, fmt.Errorf("redis: get: %w", repository.ErrNotFound)
	}
	rec, err := recordFromMap(m)
	if err != nil {
		return repository.Record{}, fmt.Errorf("redis: get: %w", err)
	}
	return rec, nil
}

// DeleteExpired implements repository.Cleaner as a no-op: Redis deletes
// expired records by itself (TTL set by Acquire), so it returns 0. It
// still refuses a non-positive limit, like every backend.
func (r *Repository) DeleteExpired(_ context.Context, _ time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("redis: delete expired: %w: limit must be positive", repository.ErrInvalidParams)
	}
	return 0, nil
}

// parseRecord decodes a script's HGETALL reply: alternating field names
// and values.
func parseRecord(v any) (repository.Record, error) {
	pairs, ok := v.([]any)
	if !ok || len(pairs)%2 != 0 || len(pairs) == 0 {
		return repository.Record{}, fmt.Errorf("unexpected script reply %T %v", v, v)
	}
	m := make(map[string]string, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		k, ok1 := pairs[i].(string)
		val, ok2 := pairs[i+1].(string)
		if !ok1 || !ok2 {
			return repository.Record{}, fmt.Errorf("unexpected script reply element %T/%T", pairs[i], pairs[i+1])
		}
		m[k] = val
	}
	return recordFromMap(m)
}

func recordFromMap(m map[string]string) (repository.Record, error) {
	rec := repository.Record{
		Consumer:   m["consumer"],
		Key:        m["key"],
		State:      repository.State(m["state"]),
		LeaseOwner: m["lease_owner"],
	}
	if v, ok := m["payload_hash"]; ok {
		rec.PayloadHash = []byte(v)
	}
	if v, ok := m["result"]; ok {
		rec.Result = []byte(v)
	}
	var err error
	if rec.Attempts, err = strconv.Atoi(m["attempts"]); err != nil {
		return repository.Record{}, fmt.Errorf("malformed record: attempts: %w", err)
	}
	for field, dst := range map[string]*time.Time{
		"lease_until":  &rec.LeaseUntil,
		"created_at":   &rec.CreatedAt,
		"completed_at": &rec.CompletedAt,
		"expires_at":   &rec.ExpiresAt,
	} {
		v, ok := m[field]
		if !ok {
			continue
		}
		us, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return repository.Record{}, fmt.Errorf("malformed record: %s: %w", field, err)
		}
		*dst = time.UnixMicro(us).UTC()
	}
	return rec, nil
}
