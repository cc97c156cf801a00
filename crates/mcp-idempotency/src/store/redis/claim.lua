-- claim: KEYS = record, scope index, all index, running index
-- ARGV = member, now, fingerprint, tool name, owner, lease_expires_at, expires_at,
--        max records per scope, max records total, key prefix, purge batch size
-- Returns {'claimed'}, {'scope'} or {'total'} (quota exceeded), or {'existing', <FIELDS...>}.
-- A live record is returned as it is, also when it is the caller's own (this claim sent again):
-- the caller recognises its owner token (ClaimOutcome::found), so nothing is counted twice.
local record, scope_index, all, running = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local member, now = ARGV[1], tonumber(ARGV[2])

-- One read: every field is false when the record does not exist.
local stored = redis.call('HMGET', record, unpack(FIELDS))
local exists = false
for i = 1, #FIELDS do
  if stored[i] then
    exists = true
    break
  end
end
if exists then
  local expires = tonumber(stored[9])
  -- A record whose expiry cannot be read is returned as it is, for the caller to report.
  if expires == nil or expires > now then
    return {'existing', unpack(stored, 1, #FIELDS)}
  end
end

-- Only live records count: an expired record (not yet purged) is scored at or before now.
local live = '(' .. ARGV[2]
local quota
if redis.call('ZCOUNT', all, live, '+inf') >= tonumber(ARGV[9]) then
  quota = 'total'
elseif redis.call('ZCOUNT', scope_index, live, '+inf') >= tonumber(ARGV[8]) then
  quota = 'scope'
end
if quota then
  purge(ARGV[10], all, running, ARGV[2], tonumber(ARGV[11]))
  return {quota}
end

if exists then
  redis.call('DEL', record)
end
redis.call('HSET', record, 'fp', ARGV[3], 'tool', ARGV[4], 'owner', ARGV[5], 'lease', ARGV[6],
  'created', ARGV[2], 'expires', ARGV[7])
local ttl = expire_in(record, tonumber(ARGV[7]) - now)
index(ttl, member, ARGV[7], {scope_index, all, running})
return {'claimed'}
