-- tick: fire due timers. Run only by the partition's owner (scheduler tier).
-- KEYS: the 13 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 epoch (ownership fencing; 0 = unfenced); 5 batch limit; 6 tombstone ttl ms.
-- Returns: {-1, newest_epoch} when the epoch is refused; else
--          {fired_or_misfired_count, next_due_ms or -1, now_ms, lateness_ms...} (one per fired job).
-- Invariants: each due member leaves 't' and enters exactly one of: 'j' + its queue's ready list
-- (fired), a 'misfired' tombstone (skip policy, grace passed), or 'd' (record names an unknown
-- queue). Work is bounded by the batch limit; the caller loops while a full batch came back.
local refused = check_epoch(tonumber(ARGV[4]))
if refused then return {-1, refused} end
local limit, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local due = redis.call('ZRANGE', K_T, '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
local nd = #due / 2
local out = {nd, -1, now}
if nd == 0 then
  out[2] = head_score() or -1
  return out
end
local has_moved = redis.call('HLEN', K_M) > 0
local jargs, per_queue = {}, {}
for i = 1, #due, 2 do
  local member, score = due[i], tonumber(due[i + 1])
  local id, rec = string.sub(member, 1, ID_LEN), string.sub(member, ID_LEN + 1)
  if has_moved then redis.call('HDEL', K_M, id) end
  local q = queue_name(rec_qidx(rec))
  if not q then
    redis.call('HSET', K_J, id, jval(rec, score))
    redis.call('ZADD', K_D, now, id)
    redis.call('HSET', K_E, id, error_blob(now, 'CorruptRecord', 'record names unknown queue index ' .. rec_qidx(rec)))
  else
    bump(K_G, 's:' .. q, -1)
    local grace = rec_opts(rec)
    if grace and now - score > grace then
      tombstone(id, 'm', now, ttl)
      release_key(id, rec)
      bump(K_C, 'misfired:' .. q)
    else
      jargs[#jargs + 1] = id
      jargs[#jargs + 1] = jval(rec, score)
      local ids = per_queue[q]
      if not ids then ids = {}; per_queue[q] = ids end
      ids[#ids + 1] = id
      out[#out + 1] = now - score
    end
  end
end
redis.call('ZREMRANGEBYRANK', K_T, 0, nd - 1)
if #jargs > 0 then multi('HSET', K_J, jargs) end
for q, ids in pairs(per_queue) do
  multi('LPUSH', PREFIX .. 'r:' .. q, ids)
  bump(K_C, 'fired:' .. q, #ids)
  redis.call('PUBLISH', CHAN .. 'ready:' .. q, PART)
end
trim_tombstones(now, limit)
flush_bumps()
out[2] = head_score() or -1
return out
