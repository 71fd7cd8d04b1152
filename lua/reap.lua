-- reap: expired leases. Run only by the partition's owner (scheduler tier).
-- KEYS: the 14 partition keys (see _lib.lua), or off a Redis Cluster the timer set alone, the others
--   named from the prefix (scheduler/protocol/calls.py ONE_KEY_OFF_CLUSTER).
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
--       MAX_INT, PART, PREFIX, arg, bump, check_epoch, common_ok, error_blob, flush_bumps, fmt, jget,
--       jval, layout_fence, now_ms, publish_ready, push_ready, queue_name, rec_attempt, rec_max,
--       rec_qidx, refusal, release_key, tally
-- Fast path: a reap that finds no expired lease, which is every reap turn the tier takes (two a
-- second per partition, idle or not) but those after a worker died, hung or outran its lease. It
-- runs before the library (see "--@library" below), so Redis does not build the closures the
-- general path needs (callgrind, one key declared: 72 k instructions against 125 k), reads what
-- the general path reads and writes nothing; an epoch this call would store or refuse, a changed
-- layout, bad arguments or an expired lease fall through to the general path before any write.
-- tests/integration/test_reap_fast_path.py compares the two.
local A = ARGV
if #A == 5 and (#KEYS == 14 or #KEYS == 1) then
  local call, string, tonumber, prefix = redis.call, string, tonumber, A[1]
  local plain = A[2] ~= prefix
  -- ARGV 1-3, KEYS[1] and the channel prefix as COMMON reads them (_lib_args.lua), then the epoch
  -- and the batch as digits (their ranges below)
  local ns, p, count, epoch_s, batch_s = string.match(
    prefix .. '|' .. A[3] .. '|' .. KEYS[1] .. '|' .. (plain and A[2] or '') .. '|' .. A[4] .. '|' .. A[5],
    plain and '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|%1:|(%d+)|(%d+)$' or
      '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t||(%d+)|(%d+)$')
  local epoch, batch = tonumber(epoch_s or ''), tonumber(batch_s or '')
  if common_ok(ns, p, count, A[3]) and #epoch_s <= 16 and epoch <= MAX_INT and batch >= 1 and
      batch <= BATCH_LIMIT_MAX then
    local m = call('HMGET', KEYS[13] or prefix .. 'meta', 'layout', 'epoch')
    if not (count ~= '' and m[1] and m[1] ~= count) and (epoch == 0 or epoch == tonumber(m[2] or '0')) then
      local t = call('TIME')
      local us = tonumber(t[2])
      local now = tonumber(t[1]) * 1000 + (us - us % 1000) / 1000
      local nxt = call('ZRANGE', KEYS[4] or prefix .. 'i', 0, 0, 'WITHSCORES')
      local deadline = tonumber(nxt[2] or '-1')
      if deadline < 0 or deadline > now then return {0, deadline, now} end
    end
  end
end
--@library
if not (COMMON and (#KEYS == 14 or #KEYS == 1)) then return arg('common', 1) end
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
