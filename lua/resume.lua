-- resume: let workers claim jobs of a paused queue in this partition again (client.resume).
-- KEYS: the 14 partition keys (see _lib.lua); the paused flags live in the hash PREFIX.."paused".
-- ARGV: 1-3 common; 4 queue name.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a queue
--   that is not a queue name, more arguments.
-- Returns: 1 when the queue was paused here and is not any more, 0 when it was not paused.
-- Invariants: no job changes state. Always rings the queue's bell with "P:resume" (ring() in
-- _lib.lua), so a worker that stopped asking because of the pause claims the jobs that waited in
-- 'r:QUEUE' at once; a lost ring costs latency only (workers re-probe paused partitions on their
-- safety-net sweep). Idempotent: a re-send changes nothing.
-- Uses: BURST_RING, CHAN, COMMON, K_META, LAYOUT, PART, PREFIX, arg, layout_fence, now_ms, refusal, ring
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local queue = arg('name', 4, 'queue')
arg('at_most', 4)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local n = redis.call('HDEL', PREFIX .. 'paused', queue)
ring(CHAN, false, queue, PART .. ':resume', now_ms(), BURST_RING) -- false: no pause check, this ring ends one
return n
