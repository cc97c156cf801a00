-- Prepended to every script of the Redis store.
--
-- A record is the hash PREFIX .. 'r:' .. member, where member is '<namespace>:<principal>:<key>'
-- with each part percent-encoded (so the last ':' separates the key).
-- It is indexed, scored by its expires_at, in PREFIX .. 'all' (every record), PREFIX .. 'run'
-- (records in progress) and PREFIX .. 's:<namespace>:<principal>' (its scope). Times are the
-- caller's milliseconds, passed as arguments: these scripts never read the server's clock.

local FIELDS = {'fp', 'tool', 'owner', 'lease', 'kind', 'body', 'done', 'created', 'expires', 'trace'}

-- Redis drops a record key this long after its retention window ends by the writer's clock, so
-- that readers whose clocks lag a little still find it while they consider it live.
local GRACE_MS = 300000
-- Time-to-live beyond which a key is simply made persistent (about 317 years).
local MAX_TTL_MS = 10000000000000

-- An index's time-to-live is pushed this much past the record that needed it, so that the
-- records written in the next hour find it long enough and leave it alone (one PEXPIRE per index
-- per hour instead of one per write).
local INDEX_SLACK_MS = 3600000

-- Sets `key`'s time-to-live to `ttl` milliseconds (at least 1); returns the time-to-live it now
-- has, -1 when it was made persistent.
local function pexpire(key, ttl)
  if ttl > MAX_TTL_MS then
    redis.call('PERSIST', key)
    return -1
  end
  local ms = math.max(math.floor(ttl), 1)
  redis.call('PEXPIRE', key, string.format('%d', ms))
  return ms
end

-- Lets `key` live `remaining` more milliseconds of retention, plus the grace period; returns its
-- time-to-live as `pexpire` does.
local function expire_in(key, remaining)
  return pexpire(key, remaining + GRACE_MS)
end

-- Scores `member` at `expires` in each index, and makes each index outlive its record, whose
-- time-to-live is `ttl` (-1: persistent, and so is then the index), so that an index never
-- disappears while one of its records still exists.
local function index(ttl, member, expires, indexes)
  for _, key in ipairs(indexes) do
    -- -2: the index is new; -1: it is already persistent.
    local current = redis.call('PTTL', key)
    redis.call('ZADD', key, expires, member)
    if current ~= -1 then
      if ttl < 0 then
        redis.call('PERSIST', key)
      elseif current < ttl then
        pexpire(key, ttl + INDEX_SLACK_MS)
      end
    end
  end
end

-- Deletes up to `limit` records whose retention ended by `now`; returns how many.
local function purge(prefix, all, running, now, limit)
  local members = redis.call('ZRANGEBYSCORE', all, '-inf', now, 'LIMIT', 0, limit)
  for _, member in ipairs(members) do
    redis.call('DEL', prefix .. 'r:' .. member)
    local scope = string.match(member, '^(.*):[^:]*$')
    if scope then
      redis.call('ZREM', prefix .. 's:' .. scope, member)
    end
  end
  if #members > 0 then
    redis.call('ZREM', all, unpack(members))
    redis.call('ZREM', running, unpack(members))
  end
  return #members
end

