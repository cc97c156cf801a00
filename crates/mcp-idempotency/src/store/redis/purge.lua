-- purge: KEYS = all index, running index
-- ARGV = key prefix, now, batch size
-- Deletes up to one batch of records whose retention ended by now; returns how many.
return purge(ARGV[1], KEYS[1], KEYS[2], ARGV[2], tonumber(ARGV[3]))
