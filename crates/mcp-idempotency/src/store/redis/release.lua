-- release: KEYS = record, scope index, all index, running index
-- ARGV = member, owner
-- Returns 1 if the owner's in-progress record was deleted, else 0.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
for i = 2, 4 do
  redis.call('ZREM', KEYS[i], ARGV[1])
end
return 1
