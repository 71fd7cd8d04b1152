-- pause: stop workers claiming jobs of a queue in this partition (client.pause, zsched queue pause).
-- KEYS: the 14 partition keys (see _lib.lua); the paused flags live in the hash PREFIX.."paused"
--       (queue -> ms when its pause started), built from the prefix like the ready lists: same slot.
-- ARGV: 1-3 common; 4 queue name; 5 since: epoch ms when the pause started (the namespace-wide value
--       kept in {ns}:cfg as paused:QUEUE, so every partition shows the same start).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a queue
--   that is not a queue name, a since_ms outside 0 to 9999-12-31 in ms, more arguments.
-- Returns: 1 when the queue was paused now in this partition, 0 when it already was (its start kept).
-- Invariants: no job changes state. tick keeps moving due jobs to 'r:QUEUE'; claim (lua/claim.lua)
-- hands none of them out while the flag is set, and answers {now_us, since} so workers stop asking
-- until resume publishes on the queue's ready channel. Idempotent (HSETNX): a re-send changes nothing.
-- Uses: COMMON, K_META, LAYOUT, MAX_MS, PREFIX, arg, fmt, layout_fence, refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local queue, since = arg('name', 4, 'queue'), arg('int', 5, 'since_ms', 0, MAX_MS)
arg('at_most', 5)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
return redis.call('HSETNX', PREFIX .. 'paused', queue, fmt(since))
