-- reap: expired leases. Run only by the partition's owner (scheduler tier).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 epoch (0 = unfenced); 5 batch limit.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, an
--   epoch outside 0 to 2^53 - 1, a batch outside 1-5000 (the tier's --batch), more arguments.
-- Returns: {-1, newest_epoch} when the epoch is refused; else
--          {reaped_count, next_lease_deadline_ms or -1, now_ms}.
-- Invariants: a job whose lease deadline passed leaves 'i'/'l' (so its token is void and the old
-- holder's ack/fail/extend are refused) and is rescheduled at now, which for a due job means its
-- ready list; or, when its attempts are spent, it goes to 'd' with a LeaseExpired error (and its
-- idempotency key is free again).
-- Bounded by the batch limit.
-- Uses: BATCH_LIMIT_MAX, CHAN, COMMON, K_C, K_D, K_E, K_G, K_I, K_J, K_K, K_L, K_META, K_Q, LAYOUT,
--       MAX_INT, PART, PREFIX, arg, bump, check_epoch, error_blob, flush_bumps, fmt, jget, jval,
--       layout_fence, now_ms, publish_ready, push_ready, queue_name, rec_attempt, rec_max,
--       rec_qidx, refusal, release_key, tally
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local epoch, limit = arg('int', 4, 'epoch', 0, MAX_INT), arg('int', 5, 'batch', 1, BATCH_LIMIT_MAX)
arg('at_most', 5)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local refused = check_epoch(K_META, epoch)
if refused then return {-1, refused} end
local now = now_ms()
local expired = redis.call('ZRANGE', K_I, '-inf', fmt(now), 'BYSCORE', 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  redis.call('ZREM', K_I, id)
  redis.call('HDEL', K_L, id)
  local rec = jget(K_J, id)
  if rec then
    local q = queue_name(K_Q, rec_qidx(rec)) or '?'
    local a, mx = rec_attempt(rec), rec_max(rec)
    bump(K_G, 'a:' .. q, -1)
    bump(K_C, 'expired:' .. q)
    local msg = 'lease expired during attempt ' .. a .. ' of ' .. mx .. ' (worker died, hung, or the lease is shorter than the handler)'
    redis.call('HSET', K_E, id, error_blob(now, 'LeaseExpired', msg))
    if a >= mx then
      redis.call('ZADD', K_D, now, id)
      release_key(K_K, id, rec)
      bump(K_G, 'd:' .. q)
      tally(K_C, PREFIX, 'dead:' .. q, 1, now)
    else
      redis.call('HSET', K_J, id, jval(rec, now))
      push_ready(PREFIX, id, q, false)
    end
  end
end
flush_bumps()
publish_ready(CHAN, PREFIX, PART, now)
local nxt = redis.call('ZRANGE', K_I, 0, 0, 'WITHSCORES')
return {#expired, tonumber(nxt[2] or '-1'), now}
