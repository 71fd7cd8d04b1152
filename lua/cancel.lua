-- cancel: scheduled (timer, or due and held by a rate limit) -> cancelled, or ready -> cancelled.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 id; 5 tombstone ttl ms.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, an id
--   that is not 15 bytes, a tombstone_ttl_ms outside 0 to 9999-12-31 in ms, more arguments.
-- Returns: 1 cancelled; 0 no live job with that id; -1 it is running (cannot be stopped, it will
-- finish or fail); -2 it is dead (use purge); -3 it is a cron's pending occurrence (remove or
-- replace the cron instead: a cron always has exactly one pending occurrence).
-- Invariants: a cancelled job is in no live structure, its idempotency key is free, and with
-- ttl > 0 a 'cancelled' summary in 'f' answers get() (due time, attempts, queue, key, last error).
-- Uses: COMMON, ID_LEN, K_F, K_J, K_M, K_META, K_T, LAYOUT, MAX_MS, PREFIX, arg, cancel_job,
--       cron_name_of, find_timer, flush_bumps, jget, layout_fence, now_ms, rec_is_cron, refusal,
--       sweep_after_tombstones
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local id, ttl = arg('id', 4), arg('int', 5, 'tombstone_ttl_ms', 0, MAX_MS)
arg('at_most', 5)
if refusal then return refusal end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local member = find_timer(K_T, K_M, id)
local rec = member and string.sub(member, ID_LEN + 1) or jget(K_J, id)
if rec and rec_is_cron(rec) then
  local name = cron_name_of(rec)
  if name and redis.call('HGET', PREFIX .. 'cron:' .. name, 'pending') == id then return -3 end
end
local now = now_ms()
local code = cancel_job(id, now, ttl)
flush_bumps()
sweep_after_tombstones(K_META, K_F, now)
return code
