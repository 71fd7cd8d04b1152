-- claim: ready -> running. Run by workers.
-- KEYS: the 13 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 queue name; 5 max jobs to claim.
-- Returns: {now_ms, id, record, token, deadline_ms, due_ms, id, ...}; just {now_ms} when empty.
--   due_ms: when this attempt became due (its fire time), for end-to-end lateness.
-- Invariants: a job popped from the ready list is in 'i' (score = lease deadline) with a new
-- token in 'l' in the same script, so a claimed job always has a lease; a malformed body goes to
-- 'd' (CorruptRecord) instead, never lost. attempt + 1 is written to
-- the record. Tokens come from one per-partition counter: every claim of a job gets a larger
-- token, which is the job's fence.
local queue, n = ARGV[4], tonumber(ARGV[5])
local now = now_ms()
local ids = redis.call('RPOP', PREFIX .. 'r:' .. queue, n)
if not ids then return {now} end
local recs = redis.call('HMGET', K_J, unpack(ids))
local base = redis.call('HINCRBY', K_META, 'fence', #ids) - #ids
local out, jargs, zargs, largs = {now}, {}, {}, {}
for i, id in ipairs(ids) do
  local v = recs[i]
  if v and not rec_valid(string.sub(v, 7)) then
    redis.call('ZADD', K_D, now, id)
    redis.call('HSET', K_E, id, error_blob(now, 'CorruptRecord', 'job record is malformed (shorter than its header or sections)'))
    bump(K_G, 'd:' .. queue)
    bump(K_C, 'dead:' .. queue)
  elseif v then
    local rec, due = string.sub(v, 7), u48(v, 1)
    local a = rec_attempt(rec) + 1
    if a > 255 then a = 255 end
    rec = rec_with_attempt(rec, a)
    local _, lease = rec_opts(rec)
    local token, deadline = base + i, now + lease
    jargs[#jargs + 1] = id; jargs[#jargs + 1] = jval(rec, due)
    zargs[#zargs + 1] = deadline; zargs[#zargs + 1] = id
    largs[#largs + 1] = id; largs[#largs + 1] = token
    out[#out + 1] = id; out[#out + 1] = rec; out[#out + 1] = token; out[#out + 1] = deadline
    out[#out + 1] = due
  end
end
if #jargs > 0 then
  multi('HSET', K_J, jargs)
  multi('ZADD', K_I, zargs)
  multi('HSET', K_L, largs)
  bump(K_G, 'a:' .. queue, #zargs / 2)
end
flush_bumps()
return out
