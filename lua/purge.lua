-- purge: dead -> gone (the end of the dead-letter runbook).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 mode: 'ids' (then job ids from ARGV[6]) or 'older' (died at or before
--       ARGV[5] ms, at most ARGV[6] jobs per call); 5 cutoff ms; 6.. limit or ids.
-- Returns: the number of jobs purged.
-- Invariants: only dead jobs are touched; their body, error and idempotency key go with them.
do local refused = layout_fence(); if refused then return refused end end
local mode = ARGV[4]
local ids
if mode == 'older' then
  ids = redis.call('ZRANGE', K_D, '-inf', ARGV[5], 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[6]))
else
  ids = {}
  for b = 6, #ARGV do ids[#ids + 1] = ARGV[b] end
end
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', K_D, id) == 1 then
    local rec = jget(id)
    redis.call('HDEL', K_J, id)
    redis.call('HDEL', K_E, id)
    if rec then
      release_key(id, rec)
      local q = queue_name(rec_qidx(rec)) or '?'
      bump(K_G, 'd:' .. q, -1)
      bump(K_C, 'purged:' .. q)
    end
    n = n + 1
  end
end
flush_bumps()
return n
