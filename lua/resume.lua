-- resume: let workers claim jobs of a paused queue in this partition again (client.resume).
-- KEYS: the 14 partition keys (see _lib.lua); the paused flags live in the hash PREFIX.."paused".
-- ARGV: 1-3 common; 4 queue name.
-- Returns: 1 when the queue was paused here and is not any more, 0 when it was not paused.
-- Invariants: no job changes state. Always publishes "P:resume" on the queue's ready channel
-- (payload = partition number, ':resume'), so workers that stopped asking because of the pause
-- claim the jobs that waited in 'r:QUEUE' at once; a lost message costs latency only (workers
-- re-probe paused partitions on their safety-net sweep). Idempotent: a re-send changes nothing.
do local refused = layout_fence(); if refused then return refused end end
local n = redis.call('HDEL', PREFIX .. 'paused', ARGV[4])
publish(CHAN .. 'ready:' .. ARGV[4], PART .. ':resume')
return n
