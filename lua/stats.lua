-- stats: read a partition's gauges and counters atomically (no state change).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common.
-- Returns: {gauges (flat field/value list), counters (flat list), ready lengths (flat queue/len
--          list), earliest due ms or -1, timers total, in-flight total, dead total, epoch, paused
--          queues (flat queue/since-ms list, lua/pause.lua)}.
-- Refuses (ZSCHED_ARG; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, more arguments.
-- Invariants: read-only (no key is written); O(queues) work, never O(jobs).
-- Uses: COMMON, K_C, K_D, K_G, K_I, K_META, K_Q, K_T, LAYOUT, PREFIX, arg, head_score,
--       layout_fence, refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
if not arg('at_most', 3) then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local queues = {}
local q = redis.call('HGETALL', K_Q)
for i = 1, #q, 2 do
  if string.sub(q[i], 1, 2) == 'n:' then
    local name = string.sub(q[i], 3)
    queues[#queues + 1] = name
    queues[#queues + 1] = redis.call('LLEN', PREFIX .. 'r:' .. name)
  end
end
return {redis.call('HGETALL', K_G), redis.call('HGETALL', K_C), queues, head_score(K_T) or -1,
        redis.call('ZCARD', K_T), redis.call('ZCARD', K_I), redis.call('ZCARD', K_D),
        redis.call('HGET', K_META, 'epoch') or '0', redis.call('HGETALL', PREFIX .. 'paused')}
