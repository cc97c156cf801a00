-- claim: KEYS = record, scope index, all index, running index; ARGV as `claim` in writes.lua.
return claim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV, 0)
