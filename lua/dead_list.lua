-- dead_list: newest dead jobs of a partition (no state change; dead-letter tooling).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 queue filter ('' = all); 5 limit; 6 scan at most this many dead entries.
-- Returns: flat list of {id, record, died_at_ms, error or false, queue name, due ms of the last
--          attempt} groups, newest first.
-- Refuses (ZSCHED_ARG; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a queue filter that is
--   neither '' nor a queue name, a limit or scan outside 1 to 2^53 - 1, more arguments.
-- Invariants: read-only (no key is written); scans at most ARGV[6] entries of 'd', so the cost
--             of a call is bounded whatever the number of dead jobs.
-- Uses: COMMON, K_D, K_E, K_J, K_META, K_Q, LAYOUT, MAX_INT, arg, fmt, jget, layout_fence,
--       queue_name, rec_qidx, refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local want, limit, scan = arg('name', 4, 'queue', true), arg('int', 5, 'limit', 1, MAX_INT), arg('int', 6, 'scan', 1, MAX_INT)
arg('at_most', 6)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local out, found, offset, page = {}, 0, 0, 200
while found < limit and offset < scan do
  local ids = redis.call('ZREVRANGE', K_D, offset, offset + page - 1, 'WITHSCORES')
  if #ids == 0 then break end
  for i = 1, #ids, 2 do
    local id = ids[i]
    local rec, due = jget(K_J, id)
    local q = rec and queue_name(K_Q, rec_qidx(rec)) or false
    if rec and (want == '' or q == want) and found < limit then
      out[#out + 1] = id; out[#out + 1] = rec; out[#out + 1] = ids[i + 1]
      out[#out + 1] = redis.call('HGET', K_E, id); out[#out + 1] = q; out[#out + 1] = fmt(due)
      found = found + 1
    end
  end
  offset = offset + page
end
return out
