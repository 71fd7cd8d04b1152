-- release: running -> ready, without spending an attempt (graceful worker shutdown hands back
-- jobs it did not finish).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; then pairs: id, token.
-- Returns: one code per pair: 1 released, 0 refused (stale token / not running).
-- Invariants: the job leaves 'i'/'l' and goes to the front of its ready list with attempt - 1.
local out = {}
for b = 4, #ARGV, 2 do
  local id, token = ARGV[b], ARGV[b + 1]
  local rec, due = jget(id)
  if redis.call('HGET', K_L, id) ~= token or not rec then
    out[#out + 1] = 0
  else
    local q = queue_name(rec_qidx(rec)) or '?'
    local a = rec_attempt(rec)
    if a > 0 then rec = rec_with_attempt(rec, a - 1) end
    redis.call('HSET', K_J, id, jval(rec, due))
    redis.call('ZREM', K_I, id)
    redis.call('HDEL', K_L, id)
    push_ready(id, q, true)
    bump(K_G, 'a:' .. q, -1)
    bump(K_C, 'released:' .. q)
    out[#out + 1] = 1
  end
end
flush_bumps()
publish_ready()
return out
