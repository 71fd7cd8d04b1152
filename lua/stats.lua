-- stats: read a partition's gauges and counters atomically (no state change).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 horizon_ms (optional: '' or absent counts nothing due soon): count the
--       timers due within this many ms of Redis's clock (0 to MAX_MS), per queue; 5 scan_max
--       (optional, default 500, 1 to 5000): read at most this many of those timers to tell their
--       queues apart: all of them when they are no more, else a quarter as many at evenly
--       spaced ranks (the scheduler tier's zsched_queue_due_soon; scheduler/metrics.py).
-- Returns: {gauges (flat field/value list), counters (flat list), ready lengths (flat queue/len
--          list), earliest due ms or -1, timers total, in-flight total, dead total, epoch, paused
--          queues (flat queue/since-ms list, lua/pause.lua), due soon (flat queue/count list of the
--          timers due by now + horizon_ms that were read), due soon total (every timer due by
--          then: more than the list's sum when there were more than scan_max; -1 without
--          horizon_ms), Redis's clock in ms (what the scheduler tier ages the earliest due timer
--          by: no TIME round trip of its own)}.
-- Refuses (ZSCHED_ARG; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a horizon_ms or
--   scan_max out of range, more arguments.
-- Invariants: read-only (no key is written); O(queues) work, never O(jobs): the due-soon count is
--             a ZCOUNT (O(log n)) and at most scan_max timers read in one range read, or a
--             quarter as many single-rank reads (O(log n) each).
-- Uses: COMMON, ID_LEN, K_C, K_D, K_G, K_I, K_META, K_Q, K_T, LAYOUT, PREFIX, arg, fmt, head_score,
--       layout_fence, now_ms, refusal, u16
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
arg('at_most', 5)
local horizon = arg('int', 4, 'horizon_ms', 0, 253402300799999, -1)
local scan_max = arg('int', 5, 'scan_max', 1, 5000, 500)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local queues, names = {}, {}
local q = redis.call('HGETALL', K_Q)
for i = 1, #q, 2 do
  if string.sub(q[i], 1, 2) == 'n:' then
    local name = string.sub(q[i], 3)
    names[tonumber(q[i + 1])] = name
    queues[#queues + 1] = name
    queues[#queues + 1] = redis.call('LLEN', PREFIX .. 'r:' .. name)
  end
end
local soon, soon_total, now = {}, -1, now_ms()
if horizon >= 0 then
  local upto = fmt(now + horizon)
  soon_total = redis.call('ZCOUNT', K_T, '-inf', upto)
  if soon_total > 0 then
    local per, order = {}, {}
    -- a timer member is the id then the record, whose first two bytes are the queue index
    local function count(member)
      local name = names[u16(member, ID_LEN + 1)] or '?'
      if per[name] == nil then per[name] = 0; order[#order + 1] = name end
      per[name] = per[name] + 1
    end
    if soon_total <= scan_max then -- every due timer: exact
      for _, member in ipairs(redis.call('ZRANGEBYSCORE', K_T, '-inf', upto)) do count(member) end
    else
      -- more: a quarter as many, each read alone (as dear as ~4 members of a range) at evenly
      -- spaced ranks (the due timers are ranks 0 to soon_total - 1), so no herd of one queue, at
      -- the front or anywhere, stands for the others
      local samples = math.max(1, math.floor(scan_max / 4))
      for i = 0, samples - 1 do
        local rank = fmt(math.floor(i * soon_total / samples))
        count(redis.call('ZRANGE', K_T, rank, rank)[1])
      end
    end
    for _, name in ipairs(order) do soon[#soon + 1] = name; soon[#soon + 1] = per[name] end
  end
end
return {redis.call('HGETALL', K_G), redis.call('HGETALL', K_C), queues, head_score(K_T) or -1,
        redis.call('ZCARD', K_T), redis.call('ZCARD', K_I), redis.call('ZCARD', K_D),
        redis.call('HGET', K_META, 'epoch') or '0', redis.call('HGETALL', PREFIX .. 'paused'), soon, soon_total, now}
