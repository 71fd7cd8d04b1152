-- inspect: read one job atomically (no state change; used by get()).
-- KEYS: the 13 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 id.
-- Returns: {} when unknown; else {state, record or false, score or false, token or false,
--          error or false, queue name or false}. score: run_at for scheduled, due time for ready, lease deadline for
--          running, time of death for dead, tombstone expiry for done/cancelled/misfired.
local id = ARGV[4]
local member, s = find_timer(id)
if member then
  local rec = string.sub(member, ID_LEN + 1)
  return {'scheduled', rec, fmt(s), false, redis.call('HGET', K_E, id), queue_name(rec_qidx(rec))}
end
local rec, due = jget(id)
if rec then
  local q, err = queue_name(rec_qidx(rec)), redis.call('HGET', K_E, id)
  local dl = redis.call('ZSCORE', K_I, id)
  if dl then return {'running', rec, dl, redis.call('HGET', K_L, id), err, q} end
  local dd = redis.call('ZSCORE', K_D, id)
  if dd then return {'dead', rec, dd, false, err, q} end
  -- held back by a rate limit: due, not fired yet, so still scheduled
  if q and redis.call('ZSCORE', PREFIX .. 'h:' .. q, id) then return {'scheduled', rec, fmt(due), false, err, q} end
  return {'ready', rec, fmt(due), false, err, q}
end
local names = {d = 'done', c = 'cancelled', m = 'misfired'}
for letter, state in pairs(names) do
  local x = redis.call('ZSCORE', K_X, id .. letter)
  if x then return {state, false, x, false, false, false} end
end
return {}
