-- list: KEYS = the index to scan
-- ARGV = key prefix, highest score, lowest score, offset, batch size, namespace, principal, key,
--        state ('run', 'done' or ''), created at or before, created after
-- Namespace, principal and key are '' (any) or '=' followed by the encoded part; the creation
-- bounds are '' (none) or milliseconds.
-- Reads one batch of the index from `offset`, highest score first, and returns how many members
-- it read (as text), then the member and FIELDS of each matching record. Members whose record is
-- gone (dropped by its time-to-live) are skipped.
local prefix = ARGV[1]
local members = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[2], ARGV[3], 'LIMIT', ARGV[4], ARGV[5])
local wanted = {ARGV[6], ARGV[7], ARGV[8]}
local state = ARGV[9]
local created_max, created_min = tonumber(ARGV[10]), tonumber(ARGV[11])

local function wanted_parts(member)
  local parts = {string.match(member, '^([^:]*):([^:]*):([^:]*)$')}
  if #parts ~= 3 then
    return false
  end
  for i = 1, 3 do
    if wanted[i] ~= '' and wanted[i] ~= '=' .. parts[i] then
      return false
    end
  end
  return true
end

local function wanted_record(fields)
  local exists = false
  for i = 1, #FIELDS do
    if fields[i] then
      exists = true
    end
  end
  if not exists then
    return false
  end
  -- FIELDS[3] is the owner (in progress only), FIELDS[8] the creation time.
  if (state == 'run' and not fields[3]) or (state == 'done' and fields[3]) then
    return false
  end
  local created = tonumber(fields[8])
  if created_max and (created == nil or created > created_max) then
    return false
  end
  if created_min and (created == nil or created <= created_min) then
    return false
  end
  return true
end

local found = {tostring(#members)}
for _, member in ipairs(members) do
  if wanted_parts(member) then
    local fields = redis.call('HMGET', prefix .. 'r:' .. member, unpack(FIELDS))
    if wanted_record(fields) then
      found[#found + 1] = member
      for i = 1, #FIELDS do
        found[#found + 1] = fields[i]
      end
    end
  end
end
return found
