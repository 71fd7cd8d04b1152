-- cron_remove: delete a cron and cancel its pending occurrence.
-- KEYS: the 14 partition keys (see _lib.lua); the partition is the cron name's.
-- ARGV: 1-3 common; 4 name; 5 tombstone ttl ms.
-- Returns: 1 removed, 0 no such cron.
-- Invariants: no pending occurrence is left behind (one already running finishes normally).
do local refused = layout_fence(); if refused then return refused end end
local name, ttl = ARGV[4], tonumber(ARGV[5])
local ck = PREFIX .. 'cron:' .. name
if redis.call('EXISTS', ck) == 0 then return 0 end
local pending = redis.call('HGET', ck, 'pending')
if pending and pending ~= '' then cancel_job(pending, now_ms(), ttl) end
redis.call('DEL', ck)
redis.call('SREM', PREFIX .. 'crons', name)
flush_bumps()
return 1
