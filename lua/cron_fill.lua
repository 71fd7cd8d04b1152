-- cron_fill: top up a cron's table of upcoming occurrences; when it has no pending occurrence
-- (table ran out during a long outage), schedule the first of them as the pending one.
-- Run by the partition owner (scheduler tier) when tick reports a cron needing attention.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 epoch (0 = unfenced); 5 name; 6 version the occurrences were computed for;
--       7 count n; then n pairs: nominal ms, fire ms, ascending, all after the table's last entry.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, an epoch
--   outside 0 to 2^53 - 1, a name that is not a cron name (validate_name), a version that is not
--   an integer from 1 to 2^53 - 1, a count below 1 or not matching the number of arguments, an
--   occurrence whose nominal ms is not after the previous one (or past 9999-12-31) or whose fire
--   ms is not 0 to 86400000 ms (cron.MAX_JITTER_S) after its nominal ms.
-- Returns: {-1, newest_epoch} when refused; {0} when the cron changed or vanished meanwhile (the
--          caller recomputes); {1, pending id} otherwise.
-- Invariants: never creates a second pending occurrence, nor one for a paused cron; occurrences already in the table are
-- not duplicated (only later ones are appended).
-- Uses: COMMON, K_META, LAYOUT, MAX_INT, PREFIX, arg, check_epoch, cron_schedule, flush_bumps,
--       layout_fence, p48, refusal, u48
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local epoch, name = arg('int', 4, 'epoch', 0, MAX_INT), arg('name', 5, 'name')
local ver, n = ARGV[6], arg('int', 7, 'count', 1, MAX_INT)
arg('int', 6, 'version', 1, MAX_INT)
if n and #ARGV ~= 7 + 2 * n then arg('refuse', 'ARGV', 'count', '7 + 2 x ARGV[7] (the occurrences)', #ARGV) end
if n then arg('occurrences', 8, 'occurrence', n) end
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local refused = check_epoch(K_META, epoch)
if refused then return {-1, refused} end
local ck = PREFIX .. 'cron:' .. name
local c = redis.call('HMGET', ck, 'ver', 'pending', 'times', 'fires', 'pnom')
if c[1] ~= ver then return {0} end
-- a paused cron (cron_pause) gets no occurrence until cron_resume
if redis.call('HEXISTS', ck, 'paused') == 1 then return {0} end
local times, fires = c[3] or '', c[4] or ''
local last = -1
if c[2] and c[2] ~= '' then last = tonumber(c[5] or '-1') end
if #times > 0 then last = math.max(last, u48(times, #times - 5)) end
local add_t, add_f = {}, {}
local first = 1
local pending = c[2]
if not pending or pending == '' then
  pending = cron_schedule(ck, name, tonumber(ARGV[8]), tonumber(ARGV[9]), 0)
  first = 2
end
for i = first, n do
  local nominal = tonumber(ARGV[6 + i * 2])
  if nominal > last then
    add_t[#add_t + 1] = p48(nominal)
    add_f[#add_f + 1] = p48(tonumber(ARGV[7 + i * 2]))
  end
end
redis.call('HSET', ck, 'times', times .. table.concat(add_t), 'fires', fires .. table.concat(add_f))
flush_bumps()
return {1, pending}
