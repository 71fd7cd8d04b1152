-- cancel: scheduled (timer, or due and held by a rate limit) -> cancelled, or ready -> cancelled.
-- KEYS: the 13 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 id; 5 tombstone ttl ms.
-- Returns: 1 cancelled; 0 no live job with that id; -1 it is running (cannot be stopped, it will
-- finish or fail); -2 it is dead (use purge).
-- Invariants: a cancelled job is in no live structure, its idempotency key is free, and with
-- ttl > 0 a 'cancelled' tombstone answers get().
local id, ttl = ARGV[4], tonumber(ARGV[5])
local now = now_ms()
local member = find_timer(id)
local rec
if member then
  rec = string.sub(member, ID_LEN + 1)
  remove_timer(id, member)
  bump(K_G, 's:' .. (queue_name(rec_qidx(rec)) or '?'), -1)
else
  rec = jget(id)
  if not rec then return 0 end
  if redis.call('ZSCORE', K_I, id) then return -1 end
  if redis.call('ZSCORE', K_D, id) then return -2 end
  local q = queue_name(rec_qidx(rec)) or '?'
  if not unlink_waiting(id, q) then
    return redis.error_reply('zsched: job body without a state (invariant broken) for cancel')
  end
  redis.call('HDEL', K_J, id)
end
redis.call('HDEL', K_E, id)
release_key(id, rec)
tombstone(id, 'c', now, ttl)
bump(K_C, 'cancelled:' .. (queue_name(rec_qidx(rec)) or '?'))
flush_bumps()
return 1
