-- cron_remove: delete a cron and cancel its pending occurrence.
-- KEYS: the 14 partition keys (see _lib.lua); the partition is the cron name's.
-- ARGV: 1-3 common; 4 name; 5 tombstone ttl ms.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a name
--   that is not a cron name (validate_name), a tombstone_ttl_ms outside 0 to 9999-12-31 in ms, more arguments.
-- Returns: 1 removed, 0 no such cron.
-- Invariants: no pending occurrence is left behind (one already running finishes normally).
-- Uses: COMMON, K_META, LAYOUT, MAX_MS, PREFIX, arg, cancel_job, flush_bumps, layout_fence, now_ms,
--       refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local name, ttl = arg('name', 4, 'name'), arg('int', 5, 'tombstone_ttl_ms', 0, MAX_MS)
arg('at_most', 5)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local ck = PREFIX .. 'cron:' .. name
if redis.call('EXISTS', ck) == 0 then return 0 end
local pending = redis.call('HGET', ck, 'pending')
if pending and pending ~= '' then cancel_job(pending, now_ms(), ttl) end
redis.call('DEL', ck)
redis.call('SREM', PREFIX .. 'crons', name)
flush_bumps()
return 1
