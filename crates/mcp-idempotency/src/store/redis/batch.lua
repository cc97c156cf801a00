-- batch: several claims and completions of one shard, each run as its own script runs it, one
-- after the other, so each sees the writes of those before it (quotas stay exact).
-- KEYS = the shard's all index, its running index, then each operation's record and scope index.
-- ARGV = for each operation, 'c' (claim) or 'd' (complete) followed by its ARGV (12 for a claim,
--        6 for a completion).
-- Returns one answer per operation, in order: what its own script returns.
local all, running = KEYS[1], KEYS[2]
local answers = {}
local o = 0
for i = 1, (#KEYS - 2) / 2 do
  local record, scope_index = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  if ARGV[o + 1] == 'c' then
    answers[i] = claim(record, scope_index, all, running, ARGV, o + 1)
    o = o + 13
  else
    answers[i] = complete(record, scope_index, all, running, ARGV, o + 1)
    o = o + 7
  end
end
return answers
