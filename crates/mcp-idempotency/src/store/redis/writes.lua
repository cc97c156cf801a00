-- Prepended to the claim, complete and batch scripts, after common.lua: the two operations that
-- a keyed call makes, as functions, so that a batch runs each exactly as its own script does.
-- Each reads its arguments from the table A from index o + 1 on (ARGV and 0 in its own script).

-- claim: keys = record, scope index, all index, running index
-- A = member, now, fingerprint, tool name, owner, lease_expires_at, expires_at,
--     max records per scope, max records total, key prefix, purge batch size, trace ('' for none)
-- Returns {'claimed'}, {'scope'} or {'total'} (quota exceeded), or {'existing', <FIELDS...>}.
-- A live record is returned as it is, also when it is the caller's own (this claim sent again):
-- the caller recognises its owner token (ClaimOutcome::found), so nothing is counted twice.
local function claim(record, scope_index, all, running, A, o)
  local member, now_arg = A[o + 1], A[o + 2]
  local now = tonumber(now_arg)

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
  local live = '(' .. now_arg
  local quota
  if redis.call('ZCOUNT', all, live, '+inf') >= tonumber(A[o + 9]) then
    quota = 'total'
  elseif redis.call('ZCOUNT', scope_index, live, '+inf') >= tonumber(A[o + 8]) then
    quota = 'scope'
  end
  if quota then
    purge(A[o + 10], all, running, now_arg, tonumber(A[o + 11]))
    return {quota}
  end

  if exists then
    redis.call('DEL', record)
  end
  local expires_at = A[o + 7]
  redis.call('HSET', record, 'fp', A[o + 3], 'tool', A[o + 4], 'owner', A[o + 5],
    'lease', A[o + 6], 'created', now_arg, 'expires', expires_at)
  if A[o + 12] ~= '' then
    redis.call('HSET', record, 'trace', A[o + 12])
  end
  local ttl = expire_in(record, tonumber(expires_at) - now)
  index(ttl, member, expires_at, {scope_index, all, running})
  return {'claimed'}
end

-- complete: keys = record, scope index, all index, running index
-- A = member, owner, outcome kind, outcome body, completed_at, expires_at
-- Returns 1 if the owner's in-progress record was completed, or if the record is already completed
-- exactly so (this script sent again after its answer was lost: nothing is written), else 0.
local function complete(record, scope_index, all, running, A, o)
  local member, owner, kind, body = A[o + 1], A[o + 2], A[o + 3], A[o + 4]
  local done, expires_at = A[o + 5], A[o + 6]
  local state = redis.call('HMGET', record, 'owner', 'kind', 'body', 'done', 'expires')
  if state[1] ~= owner then
    if not state[1] and state[2] == kind and state[3] == body and state[4] == done
        and state[5] == expires_at then
      return 1
    end
    return 0
  end
  redis.call('HDEL', record, 'owner', 'lease')
  redis.call('HSET', record, 'kind', kind, 'body', body, 'done', done, 'expires', expires_at)
  local ttl = expire_in(record, tonumber(expires_at) - tonumber(done))
  index(ttl, member, expires_at, {scope_index, all})
  redis.call('ZREM', running, member)
  return 1
end

