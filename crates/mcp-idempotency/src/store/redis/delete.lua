-- delete: KEYS = record, scope index, all index, running index
-- ARGV = member
-- Deletes the record whatever its state; returns 1 if it existed, else 0.
local existed = redis.call('DEL', KEYS[1])
for i = 2, 4 do
  redis.call('ZREM', KEYS[i], ARGV[1])
end
return existed
