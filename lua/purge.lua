-- purge: dead -> gone (the end of the dead-letter runbook).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 mode: 'ids' (then job ids from ARGV[6]) or 'older' (died at or before
--       ARGV[5] ms, at most ARGV[6] jobs per call); 5 cutoff ms; 6.. limit or ids.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a mode
--   other than 'ids' or 'older', a cutoff outside 0 to 9999-12-31 in ms; with 'older' a limit
--   outside 1-5000 or more arguments, with 'ids' no id or an id that is not 15 bytes.
-- Returns: the number of jobs purged.
-- Invariants: only dead jobs are touched; their body, error and idempotency key go with them.
-- Uses: BATCH_LIMIT_MAX, COMMON, K_C, K_D, K_E, K_G, K_J, K_K, K_META, K_Q, LAYOUT, MAX_MS, arg,
--       bump, flush_bumps, fmt, jget, layout_fence, queue_name, rec_qidx, refusal, release_key
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local mode = ARGV[4]
if mode ~= 'ids' and mode ~= 'older' then arg('refuse', 4, 'mode', "'ids' or 'older'", mode) end
local cutoff, limit = arg('int', 5, 'cutoff_ms', 0, MAX_MS), nil
if mode == 'older' then
  limit = arg('int', 6, 'limit', 1, BATCH_LIMIT_MAX)
  arg('at_most', 6)
else
  arg('groups', 6, 'job ids', 1, 1)
  for b = 6, #ARGV do arg('id', b) end
end
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local ids
if mode == 'older' then
  ids = redis.call('ZRANGE', K_D, '-inf', fmt(cutoff), 'BYSCORE', 'LIMIT', 0, limit)
else
  ids = {}
  for b = 6, #ARGV do ids[#ids + 1] = ARGV[b] end
end
local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', K_D, id) == 1 then
    local rec = jget(K_J, id)
    redis.call('HDEL', K_J, id)
    redis.call('HDEL', K_E, id)
    if rec then
      release_key(K_K, id, rec)
      local q = queue_name(K_Q, rec_qidx(rec)) or '?'
      bump(K_G, 'd:' .. q, -1)
      bump(K_C, 'purged:' .. q)
    end
    n = n + 1
  end
end
flush_bumps()
return n
