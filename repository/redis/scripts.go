package redis

import goredis "github.com/redis/go-redis/v9"

// Scripts run with KEYS[1] = the record's hash. Times are Unix
// microseconds (exact in Lua's doubles until the year 2255). Every script
// returns 0 when the caller does not hold what it claims to hold.

// fence stops a script unless the record is in_progress and leased to
// ARGV[1]. A missing record fails the check too (HMGET returns false).
const fence = `
local h = redis.call('HMGET', KEYS[1], 'state', 'lease_owner')
if h[1] ~= 'in_progress' or h[2] ~= ARGV[1] then
	return 0
end
`

// acquireScript creates the in_progress record unless a live one exists.
// ARGV: 1 consumer, 2 storage key, 3 payload hash, 4 "1" if a payload hash
// is given, 5 owner, 6 now, 7 lease until, 8 expires at (µs), 9 expires at
// (ms, for PEXPIREAT). Returns 1 when acquired, else the stored record as
// HGETALL pairs.
var acquireScript = goredis.NewScript(`
local exp = redis.call('HGET', KEYS[1], 'expires_at')
if exp and tonumber(exp) > tonumber(ARGV[6]) then
	return redis.call('HGETALL', KEYS[1])
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1],
	'consumer', ARGV[1], 'key', ARGV[2], 'state', 'in_progress', 'attempts', 1,
	'lease_owner', ARGV[5], 'lease_until', ARGV[7], 'created_at', ARGV[6], 'expires_at', ARGV[8])
if ARGV[4] == '1' then
	redis.call('HSET', KEYS[1], 'payload_hash', ARGV[3])
end
redis.call('PEXPIREAT', KEYS[1], ARGV[9])
return 1
`)

// reclaimScript hands an expired lease held by ARGV[1] to ARGV[2] and
// counts the attempt. ARGV: 1 previous owner, 2 owner, 3 now, 4 lease
// until. Returns the updated record as HGETALL pairs.
var reclaimScript = goredis.NewScript(fence + `
local t = redis.call('HMGET', KEYS[1], 'lease_until', 'expires_at')
local now = tonumber(ARGV[3])
if tonumber(t[1]) > now or tonumber(t[2]) <= now then
	return 0
end
redis.call('HSET', KEYS[1], 'lease_owner', ARGV[2], 'lease_until', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
return redis.call('HGETALL', KEYS[1])
`)

// extendScript moves the lease deadline. ARGV: 1 owner, 2 lease until.
var extendScript = goredis.NewScript(fence + `
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
return 1
`)

// completeLua marks the record completed at ARGV[2] with the result
// ARGV[3] if ARGV[4] is "1", else none (nil and empty are different
// results); Complete and Resolve share it.
const completeLua = `
redis.call('HSET', KEYS[1], 'state', 'completed', 'completed_at', ARGV[2])
if ARGV[4] == '1' then
	redis.call('HSET', KEYS[1], 'result', ARGV[3])
else
	redis.call('HDEL', KEYS[1], 'result')
end
return 1
`

// completeScript marks the record completed with its result. ARGV: 1
// owner, then as completeLua.
var completeScript = goredis.NewScript(fence + completeLua)

// releaseScript deletes the record. ARGV: 1 owner.
var releaseScript = goredis.NewScript(fence + `
redis.call('DEL', KEYS[1])
return 1
`)
