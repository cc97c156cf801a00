-- renew: KEYS = record, scope index, all index, running index
-- ARGV = member, owner, lease_expires_at
-- Returns 1 if the owner's lease was moved (and the retention window extended to cover it), else 0.
local record = KEYS[1]
if redis.call('HGET', record, 'owner') ~= ARGV[2] then
  return 0
end
redis.call('HSET', record, 'lease', ARGV[3])
local lease = tonumber(ARGV[3])
local expires = tonumber(redis.call('HGET', record, 'expires'))
if expires == nil or lease > expires then
  -- Push the key's own expiry back by as much as the retention window moved.
  local ttl = redis.call('PTTL', record)
  if ttl >= 0 and expires ~= nil then
    ttl = pexpire(record, ttl + (lease - expires))
  end
  redis.call('HSET', record, 'expires', ARGV[3])
  index(ttl, ARGV[1], ARGV[3], {KEYS[2], KEYS[3], KEYS[4]})
end
return 1
