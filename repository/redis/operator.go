package redis

import (
	"context"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/watermill-idempotent/internal/storekit"
	"github.com/idemkit/watermill-idempotent/repository"
)

// scanBatch is the COUNT hint of each SCAN and the size of each pipeline
// of HGETALLs in ListStuck.
const scanBatch = 500

// globEscaper escapes the characters SCAN's MATCH treats as a pattern.
var globEscaper = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)

// resolveScript resolves a stuck record. KEYS[1] = the record's hash.
// ARGV: 1 expected owner, 2 now (µs), 3 result, 4 "1" if a result is
// given, 5 action ("complete" or "release"). Returns -1 when the record is
// missing or expired, 0 when it is not in progress under an expired lease
// of the expected owner, 1 when resolved.
var resolveScript = goredis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'state', 'lease_owner', 'lease_until', 'expires_at')
local now = tonumber(ARGV[2])
if not h[4] or tonumber(h[4]) <= now then
	return -1
end
if h[1] ~= 'in_progress' or h[2] ~= ARGV[1] or tonumber(h[3]) > now then
	return 0
end
if ARGV[5] == 'release' then
	redis.call('DEL', KEYS[1])
	return 1
end` + completeLua)

// storedRecordKey is RecordKey for a key that is already in its stored
// form (Record.Key): it is not hashed again.
func (r *Repository) storedRecordKey(consumer, storedKey string) string {
	return r.prefix + "{" + consumerEscaper.Replace(consumer) + ":" + storedKey + "}"
}

// ListStuck implements repository.Operator by walking the key space under
// the prefix (narrowed to one consumer when ListStuckParams.Consumer is
// set) with SCAN and reading each record with pipelined HGETALLs, then
// sorting the stuck ones by lease. Its cost grows with the number of
// records under the prefix, not with the number of stuck ones: it is meant
// for an operator tool, not the hot path. SCAN does not block the server,
// but its view is not a snapshot: records written during the walk may be
// missed or seen. Over a *redis.ClusterClient it walks every master
// (ForEachMaster), over a *redis.Ring every shard.
func (r *Repository) ListStuck(ctx context.Context, p repository.ListStuckParams) ([]repository.Record, error) {
	p, err := storekit.ValidateListStuck(p)
	if err != nil {
		return nil, err
	}
	match := globEscaper.Replace(r.prefix) + "{*"
	if p.Consumer != "" {
		match = globEscaper.Replace(r.prefix+"{"+consumerEscaper.Replace(p.Consumer)+":") + "*"
	}
	now := p.Now.UTC()
	var recs []repository.Record
	err = r.scanEach(ctx, match, func(pipe goredis.Pipeliner, k string) { pipe.HGetAll(ctx, k) }, func(k string, cmd goredis.Cmder) error {
		m, err := cmd.(*goredis.MapStringStringCmd).Result()
		if err != nil || len(m) == 0 { // empty: deleted since the SCAN saw it
			return err
		}
		rec, err := recordFromMap(m)
		if err != nil {
			return err
		}
		if rec.State == repository.StateInProgress && !rec.LeaseUntil.After(now) && rec.ExpiresAt.After(now) &&
			(p.Consumer == "" || rec.Consumer == p.Consumer) {
			recs = append(recs, rec)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis: list stuck: %w", err)
	}
	return storekit.OrderStuck(recs, p.Limit), nil
}

// scanEach walks the keys matching match on every node that holds records
// (scanKeys) and, a pipeline of at most scanBatch keys at a time, queues
// one command per key and hands each key's reply to each.
func (r *Repository) scanEach(ctx context.Context, match string, queue func(goredis.Pipeliner, string), each func(string, goredis.Cmder) error) error {
	return r.scanKeys(ctx, match, func(batch []string) error {
		cmds, err := r.client.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
			for _, k := range batch {
				queue(pipe, k)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for i, cmd := range cmds {
			if err := each(batch[i], cmd); err != nil {
				return fmt.Errorf("%s: %w", batch[i], err)
			}
		}
		return nil
	})
}

// Resolve implements repository.Operator with one Lua script that checks
// state, owner, lease expiry and record expiry and then completes (keeping
// the record's TTL) or deletes the record.
func (r *Repository) Resolve(ctx context.Context, p repository.ResolveParams) error {
	if err := storekit.ValidateResolve(p); err != nil {
		return err
	}
	action := "complete"
	if p.Action == repository.ResolveRelease {
		action = "release"
	}
	v, err := r.run(ctx, resolveScript, r.storedRecordKey(p.Consumer, p.Key), replyIsOne,
		p.ExpectedOwner, micros(p.Now), p.Result, flag(p.Result), action)
	if err != nil {
		return fmt.Errorf("redis: resolve (%s): %w", p.Action, err)
	}
	n, ok := v.(int64)
	if !ok {
		return fmt.Errorf("redis: resolve (%s): unexpected script reply %T %v", p.Action, v, v)
	}
	switch n {
	case 1:
		return nil
	case -1:
		return fmt.Errorf("redis: resolve (%s) %q/%q: %w", p.Action, p.Consumer, p.Key, repository.ErrNotFound)
	default:
		return fmt.Errorf("redis: resolve (%s) %q/%q: the record is no longer in progress under an expired lease of %q: %w",
			p.Action, p.Consumer, p.Key, p.ExpectedOwner, repository.ErrLeaseLost)
	}
}

var _ repository.Operator = (*Repository)(nil)
