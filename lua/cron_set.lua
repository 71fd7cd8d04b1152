-- cron_set: create or replace a cron and its one pending occurrence.
-- KEYS: the 14 partition keys (see _lib.lua); the partition is the cron name's.
-- ARGV: 1-3 common; 4 name; 5 queue; 6 definition (msgpack, for Python readers); 7 record head;
--       8 record tail (see codec.split_template); 9 tombstone ttl ms; 10 count n of occurrences;
--       11 placement hash of the name (crc32, decimal: the h of its occurrences' ids, see
--       scheduler/protocol/ids.py); then n pairs: nominal ms, fire ms (jitter applied), ascending.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a name
--   or queue that is not a name (validate_name), a definition that is not a msgpack map (its first
--   byte) or is longer than 4096 bytes (the client's is a few hundred), a head and tail that are not a job record template
--   (codec.split_template: the head is the header and its grace and lease sections, with no key
--   or trace section;
--   record_problem), a tombstone_ttl_ms outside 0 to 9999-12-31 in ms, a count below 1 or not
--   matching the number of arguments, a placement hash outside 0 to 2^32 - 1, an occurrence whose
--   nominal ms is not after the previous one (or past 9999-12-31) or whose fire ms is not 0 to
--   86400000 ms (cron.MAX_JITTER_S) after its nominal ms.
-- Returns: the id of the pending occurrence.
-- Invariants: afterwards the cron has exactly one pending occurrence (the first pair); a replaced
-- cron's pending occurrence is cancelled first (unless it is already running: it finishes); a
-- paused cron that is replaced is active again.
-- Uses: COMMON, K_META, LAYOUT, MAX_INT, MAX_MS, PREFIX, arg, cancel_job, cron_schedule,
--       flush_bumps, fmt, layout_fence, now_ms, p48, record_problem, refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local name, queue, def, head, tail = arg('name', 4, 'name'), arg('name', 5, 'queue'), ARGV[6], ARGV[7], ARGV[8]
local m = def and string.byte(def, 1) -- a msgpack map: fixmap 0x80-0x8f, map 16 0xde, map 32 0xdf
if not m or #def > 4096 or not ((m >= 128 and m <= 143) or m == 222 or m == 223) then
  arg('refuse', 6, 'definition', 'a msgpack map of at most 4096 bytes', def)
end
local problem = (not head or not tail) and 'a record template' or record_problem(head .. tail, 0, '')
if not problem then
  local flags = string.byte(head, 5)
  if flags >= 32 then
    problem = 'a template without a trace section (each occurrence is a new trace, not the setter\'s)'
  elseif #head ~= 9 + (flags % 2 == 1 and 4 or 0) + (flags >= 8 and 4 or 0) then
    problem = 'the header and its grace and lease sections (codec.split_template)'
  end
end
if problem then arg('refuse', 7, 'record_head', problem, head) end
local ttl, n = arg('int', 9, 'tombstone_ttl_ms', 0, MAX_MS), arg('int', 10, 'count', 1, MAX_INT)
local placement = arg('int', 11, 'placement', 0, 4294967295)
if n and #ARGV ~= 11 + 2 * n then arg('refuse', 'ARGV', 'count', '11 + 2 x ARGV[10] (the occurrences)', #ARGV) end
if n then arg('occurrences', 12, 'occurrence', n) end
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
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
redis.call('HSET', ck, 'def', def, 'head', head, 'tail', tail, 'queue', queue, 'h', fmt(placement),
  'times', table.concat(times), 'fires', table.concat(fires), 'pending', '')
redis.call('HDEL', ck, 'paused') -- replacing a paused cron resumes it
redis.call('SADD', PREFIX .. 'crons', name)
local id = cron_schedule(ck, name, tonumber(ARGV[12]), tonumber(ARGV[13]), 0)
flush_bumps()
return {id, ver}
