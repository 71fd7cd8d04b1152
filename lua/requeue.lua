-- requeue: dead -> scheduled (or ready when due), attempts reset to 0.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 run_at: absolute epoch ms (0 = now), or "ESTrDELTA" for now + DELTA ms by
--       this script's clock (TIME; arg('at') in _lib.lua, as schedule; EST is not used here);
--       then job ids.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a
--   run_at that is not 0, epoch ms up to 9999-12-31 or "ESTrDELTA" landing in that range, no id,
--   an id that is not 15 bytes.
-- Returns: one code per id: 1 requeued, 0 not dead (already requeued, live, or unknown), so
-- requeuing twice runs the job once.
-- Invariants: the job leaves 'd' and enters exactly one of 't' or its ready list. Its last error
-- stays readable until it succeeds. It takes its idempotency key back if no other live job holds
-- it (the key was freed when it died).
-- Uses: CHAN, COMMON, K_C, K_D, K_G, K_J, K_K, K_META, K_Q, K_T, LAYOUT, PART, PREFIX, arg, bump,
--       head_score, jget, layout_fence, now_ms, place, queue_name, rec_opts, rec_qidx,
--       rec_with_attempt, refusal, settle
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local now = now_ms()
local at = arg('at', 4, 'run_at', now)
arg('groups', 5, 'job ids', 1, 1)
for b = 5, #ARGV do arg('id', b) end
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
if at <= 0 then at = now end
local head, earliest = head_score(K_T), nil
local out = {}
for b = 5, #ARGV do
  local id = ARGV[b]
  local rec = jget(K_J, id)
  if not rec or not redis.call('ZSCORE', K_D, id) then
    out[#out + 1] = 0
  else
    local q = queue_name(K_Q, rec_qidx(rec)) or '?'
    rec = rec_with_attempt(rec, 0)
    redis.call('ZREM', K_D, id)
    bump(K_G, 'd:' .. q, -1)
    bump(K_C, 'requeued:' .. q)
    local _, _, key = rec_opts(rec)
    if key then redis.call('HSETNX', K_K, key, id) end  -- takes its key back unless a live job has it
    local t = place(id, rec, q, at, now)
    if t and (earliest == nil or t < earliest) then earliest = t end
    out[#out + 1] = 1
  end
end
settle(CHAN, PREFIX, PART, earliest, head, now)
return out
