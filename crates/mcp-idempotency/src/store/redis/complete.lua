-- complete: KEYS = record, scope index, all index, running index
-- ARGV = member, owner, outcome kind, outcome body, completed_at, expires_at
-- Returns 1 if the owner's in-progress record was completed, else 0.
local record = KEYS[1]
if redis.call('HGET', record, 'owner') ~= ARGV[2] then
  return 0
end
redis.call('HDEL', record, 'owner', 'lease')
redis.call('HSET', record, 'kind', ARGV[3], 'body', ARGV[4], 'done', ARGV[5], 'expires', ARGV[6])
expire_in(record, tonumber(ARGV[6]) - tonumber(ARGV[5]))
index(record, ARGV[1], ARGV[6], {KEYS[2], KEYS[3]})
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
