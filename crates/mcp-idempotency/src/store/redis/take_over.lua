-- take_over: KEYS = record, scope index, all index, running index
-- ARGV = member, previous owner, new owner, now, lease_expires_at, expires_at, the new owner's
--        traceparent ('' for none), which replaces the record's trace
-- Returns 1 if the live record was in progress under the previous owner with a lease that ran out
-- by now and now belongs to the new owner, or if it is already the new owner's (this script sent
-- again after its answer was lost: nothing is written), else 0.
local record = KEYS[1]
local state = redis.call('HMGET', record, 'owner', 'lease', 'expires', 'created')
local now, lease, expires = tonumber(ARGV[4]), tonumber(state[2]), tonumber(state[3])
if state[1] == ARGV[3] and expires ~= nil and expires > now then
  return 1
end
if state[1] ~= ARGV[2] then
  return 0
end
if lease == nil or expires == nil or lease > now or expires <= now then
  return 0
end
redis.call('HSET', record, 'owner', ARGV[3], 'lease', ARGV[5], 'expires', ARGV[6])
if ARGV[7] ~= '' and state[4] then
  redis.call('HSET', record, 'trace', ARGV[7] .. ' ' .. state[4])
else
  redis.call('HDEL', record, 'trace')
end
local ttl = expire_in(record, tonumber(ARGV[6]) - now)
index(ttl, ARGV[1], ARGV[6], {KEYS[2], KEYS[3], KEYS[4]})
return 1
