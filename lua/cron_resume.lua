-- cron_resume: resume a paused cron from now: occurrences missed while it was paused are not run.
-- KEYS: the 14 partition keys (see _lib.lua); the partition is the cron name's.
-- ARGV: 1-3 common; 4 name; 5 count n of occurrences; then n pairs: nominal ms, fire ms (jitter
--       applied), ascending, all after now (computed by the caller from the cron's definition).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a name
--   that is not a cron name (validate_name), a count below 1 or not matching the number of
--   arguments, an occurrence whose nominal ms is not after the previous one (or past 9999-12-31) or
--   whose fire ms is not 0 to 86400000 ms (cron.MAX_JITTER_S) after its nominal ms.
-- Returns: {status, pending id or ''}: 1 resumed (the id of its new pending occurrence), 0 it was
--          not paused (nothing changed), -1 no such cron.
-- Invariants: afterwards a resumed cron has exactly one pending occurrence (the first pair) and the
-- rest as its table; occurrences between the pause and now are neither run nor counted as missed
-- (the pause was the operator's decision). Idempotent: a re-send finds the cron not paused.
-- Uses: COMMON, K_META, LAYOUT, MAX_INT, PREFIX, arg, cron_schedule, flush_bumps, layout_fence,
--       p48, refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local name, n = arg('name', 4, 'name'), arg('int', 5, 'count', 1, MAX_INT)
if n and #ARGV ~= 5 + 2 * n then arg('refuse', 'ARGV', 'count', '5 + 2 x ARGV[5] (the occurrences)', #ARGV) end
if n then arg('occurrences', 6, 'occurrence', n) end
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local ck = PREFIX .. 'cron:' .. name
if redis.call('EXISTS', ck) == 0 then return {-1, ''} end
if not redis.call('HGET', ck, 'paused') then return {0, ''} end
local times, fires = {}, {}
for i = 2, n do
  times[#times + 1] = p48(tonumber(ARGV[4 + i * 2]))
  fires[#fires + 1] = p48(tonumber(ARGV[5 + i * 2]))
end
redis.call('HDEL', ck, 'paused')
redis.call('HINCRBY', ck, 'ver', 1)
redis.call('HSET', ck, 'times', table.concat(times), 'fires', table.concat(fires), 'pending', '')
local id = cron_schedule(ck, name, tonumber(ARGV[6]), tonumber(ARGV[7]), 0)
flush_bumps()
return {1, id}
