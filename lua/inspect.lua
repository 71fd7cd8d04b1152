-- inspect: read jobs atomically (no state change; used by get() and get_many()).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4.. job ids (15 bytes each, all of this partition; the client sends at most
--       a few hundred per call).
-- Returns: one reply per id, in order. A reply is {} when the id is unknown (or its tombstone
--          expired); else {state, record or false, score or false, token or false, error or false,
--          queue name or false, due ms or false, summary or false}:
--   score: run_at for scheduled (in the timer set), due time for scheduled-held (rate limit) and
--          ready, lease deadline for running, time of death for dead, expiry for tombstones.
--   due:   when the current or last attempt became due: the timer score for a scheduled job, the
--          due time stored in 'j' for held/ready/running/dead, the summary's for a tombstone.
--   token: the lease token (fence) of a running job.
--   summary: done/cancelled/misfired only: the packed summary from 'f' (layout in _lib.lua
--          tombstone(); its queue index is resolved into 'queue name'), or false for a
--          tombstone written before summaries existed (legacy 'x': only its expiry is known).
-- Refuses (ZSCHED_ARG; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, no id, an id that is
--   not 15 bytes.
-- Invariants: read-only (no key is written); every job state is read in this one atomic call,
--             so a job moving meanwhile is seen in exactly one state.
-- Uses: COMMON, ID_LEN, K_D, K_E, K_F, K_I, K_J, K_L, K_M, K_META, K_Q, K_T, K_X, LAYOUT, PREFIX,
--       arg, find_timer, fmt, jget, layout_fence, queue_name, rec_qidx, refusal, u16, u48
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
arg('groups', 4, 'job ids', 1, 1)
for b = 4, #ARGV do arg('id', b) end
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local function look(id)
  local member, s = find_timer(K_T, K_M, id)
  if member then
    local rec = string.sub(member, ID_LEN + 1)
    return {'scheduled', rec, fmt(s), false, redis.call('HGET', K_E, id), queue_name(K_Q, rec_qidx(rec)), fmt(s), false}
  end
  local rec, due = jget(K_J, id)
  if rec then
    local q, err = queue_name(K_Q, rec_qidx(rec)), redis.call('HGET', K_E, id)
    local dl = redis.call('ZSCORE', K_I, id)
    if dl then return {'running', rec, dl, redis.call('HGET', K_L, id), err, q, fmt(due), false} end
    local dd = redis.call('ZSCORE', K_D, id)
    if dd then return {'dead', rec, dd, false, err, q, fmt(due), false} end
    -- held back by a rate limit: due, not fired yet, so still scheduled
    if q and redis.call('ZSCORE', PREFIX .. 'h:' .. q, id) then
      return {'scheduled', rec, fmt(due), false, err, q, fmt(due), false}
    end
    return {'ready', rec, fmt(due), false, err, q, fmt(due), false}
  end
  local names = {d = 'done', c = 'cancelled', m = 'misfired'}
  local v = redis.call('HGET', K_F, id)
  if v and #v >= 28 and names[string.sub(v, 1, 1)] then
    return {names[string.sub(v, 1, 1)], false, fmt(u48(v, 8)), false, false, queue_name(K_Q, u16(v, 14)),
            fmt(u48(v, 18)), v}
  end
  if redis.call('EXISTS', K_X) == 1 then
    for letter, state in pairs(names) do
      local x = redis.call('ZSCORE', K_X, id .. letter)
      if x then return {state, false, x, false, false, false, false, false} end
    end
  end
  return {}
end

local out = {}
for b = 4, #ARGV do out[#out + 1] = look(ARGV[b]) end
return out
