-- complete: KEYS = record, scope index, all index, running index; ARGV as `complete` in
-- writes.lua.
return complete(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV, 0)
