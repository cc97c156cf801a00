-- complete: KEYS = record, scope index, all index, running index
-- ARGV = member, owner, outcome kind, outcome body, completed_at, expires_at
-- Returns 1 if the owner's in-progress record was completed, or if the record is already completed
-- exactly so (this script sent again after its answer was lost: nothing is written), else 0.
local record = KEYS[1]
local state = redis.call('HMGET', record, 'owner', 'kind', 'body', 'done', 'expires')
if state[1] ~= ARGV[2] then
  if not state[1] and state[2] == ARGV[3] and state[3] == ARGV[4] and state[4] == ARGV[5]
      and state[5] == ARGV[6] then
    return 1
  end
  return 0
end
redis.call('HDEL', record, 'owner', 'lease')
redis.call('HSET', record, 'kind', ARGV[3], 'body', ARGV[4], 'done', ARGV[5], 'expires', ARGV[6])
local ttl = expire_in(record, tonumber(ARGV[6]) - tonumber(ARGV[5]))
index(ttl, ARGV[1], ARGV[6], {KEYS[2], KEYS[3]})
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
