-- cron_set: create or replace a cron and its one pending occurrence.
-- KEYS: the 14 partition keys (see _lib.lua); the partition is the cron name's.
-- ARGV: 1-3 common; 4 name; 5 queue; 6 definition (msgpack, for Python readers); 7 record head;
--       8 record tail (see codec.split_template); 9 tombstone ttl ms; 10 count n of occurrences;
--       11 placement hash of the name (crc32, decimal: the h of its occurrences' ids, see
--       scheduler/protocol/ids.py); then n pairs: nominal ms, fire ms (jitter applied), ascending.
-- Returns: the id of the pending occurrence.
-- Invariants: afterwards the cron has exactly one pending occurrence (the first pair); a replaced
-- cron's pending occurrence is cancelled first (unless it is already running: it finishes); a
-- paused cron that is replaced is active again.
do local refused = layout_fence(); if refused then return refused end end
local name, queue, def, head, tail, ttl, n = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
local now = now_ms()
local ck = PREFIX .. 'cron:' .. name
local old = redis.call('HGET', ck, 'pending')
if old and old ~= '' then cancel_job(old, now, ttl) end
local ver = redis.call('HINCRBY', ck, 'ver', 1)
local times, fires = {}, {}
for i = 2, n do
  times[#times + 1] = p48(tonumber(ARGV[10 + i * 2]))
  fires[#fires + 1] = p48(tonumber(ARGV[11 + i * 2]))
end
redis.call('HSET', ck, 'def', def, 'head', head, 'tail', tail, 'queue', queue, 'h', ARGV[11],
  'times', table.concat(times), 'fires', table.concat(fires), 'pending', '')
redis.call('HDEL', ck, 'paused') -- replacing a paused cron resumes it
redis.call('SADD', PREFIX .. 'crons', name)
local id = cron_schedule(ck, name, tonumber(ARGV[12]), tonumber(ARGV[13]), 0)
flush_bumps()
return {id, ver}
