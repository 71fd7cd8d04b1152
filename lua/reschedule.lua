-- reschedule: scheduled/ready -> scheduled at a new time (or ready when it is due).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 id; 5 new run_at: absolute epoch ms, or "ESTrDELTA" for now + DELTA ms by
--       this script's clock (TIME; arg('at') in _lib.lua, as schedule: a producer whose clock is
--       off cannot move the job early; EST, the client's estimate, is not used here).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, an id
--   that is not 15 bytes, a run_at that is not epoch ms up to 9999-12-31 or "ESTrDELTA" landing in
--   that range, more arguments.
-- Returns: 1 moved; 0 no live job with that id; -1 running; -2 dead (use requeue).
-- Invariants: the job keeps its id, attempts and payload and is in exactly one state after.
-- Uses: CHAN, COMMON, ID_LEN, K_C, K_D, K_G, K_I, K_J, K_M, K_META, K_Q, K_T, LAYOUT, PART, PREFIX,
--       arg, bump, find_timer, flush_bumps, head_score, jget, layout_fence, now_ms, place,
--       publish_ready, queue_name, rec_qidx, refusal, remove_timer, unlink_waiting, wake_scheduler
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local now = now_ms()
local id, at = arg('id', 4), arg('at', 5, 'run_at', now)
arg('at_most', 5)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local head = head_score(K_T)
local member = find_timer(K_T, K_M, id)
local rec, q
if member then
  rec = string.sub(member, ID_LEN + 1)
  q = queue_name(K_Q, rec_qidx(rec)) or '?'
  remove_timer(K_T, K_M, id, member)
  bump(K_G, 's:' .. q, -1)
else
  rec = jget(K_J, id)
  if not rec then return 0 end
  if redis.call('ZSCORE', K_I, id) then return -1 end
  if redis.call('ZSCORE', K_D, id) then return -2 end
  q = queue_name(K_Q, rec_qidx(rec)) or '?'
  if not unlink_waiting(PREFIX, K_G, id, q) then
    return redis.error_reply('zsched: job body without a state (invariant broken) for reschedule')
  end
  redis.call('HDEL', K_J, id)
end
local t = place(id, rec, q, at, now)
if t and (head == nil or t < head) then wake_scheduler(CHAN, PART) end
bump(K_C, 'rescheduled:' .. q)
flush_bumps()
publish_ready(CHAN, PREFIX, PART, now)
return 1
