-- cron_pause: pause a cron: its pending occurrence is cancelled and no occurrence is generated
-- until cron_resume (client.pause_cron, zsched cron pause).
-- KEYS: the 14 partition keys (see _lib.lua); the partition is the cron name's.
-- ARGV: 1-3 common; 4 name; 5 tombstone ttl ms.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a name
--   that is not a cron name (validate_name), a tombstone_ttl_ms outside 0 to 9999-12-31 in ms, more arguments.
-- Returns: {status, paused_since_ms}: status 1 paused now, 0 already paused, -1 no such cron
--          (paused_since_ms 0 then).
-- Invariants: afterwards the cron has no pending occurrence and an empty table of upcoming
-- occurrences, and its hash holds 'paused' (ms); cron_fill refuses to schedule for a paused cron, so
-- neither a tick nor an owner's cron sweep creates one. An occurrence already running finishes.
-- Idempotent: a paused cron is left as it is.
-- Uses: COMMON, K_META, LAYOUT, MAX_MS, PREFIX, arg, cancel_job, flush_bumps, fmt, layout_fence,
--       now_ms, refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local name, ttl = arg('name', 4, 'name'), arg('int', 5, 'tombstone_ttl_ms', 0, MAX_MS)
arg('at_most', 5)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local ck = PREFIX .. 'cron:' .. name
if redis.call('EXISTS', ck) == 0 then return {-1, 0} end
local since = redis.call('HGET', ck, 'paused')
if since then return {0, tonumber(since)} end
local now = now_ms()
local pending = redis.call('HGET', ck, 'pending')
if pending and pending ~= '' then cancel_job(pending, now, ttl) end
redis.call('HSET', ck, 'paused', fmt(now), 'pending', '', 'times', '', 'fires', '')
redis.call('HINCRBY', ck, 'ver', 1)
flush_bumps()
return {1, now}
