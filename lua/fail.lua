-- fail: running -> scheduled (retry after a delay) or running -> dead. Run by workers.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; then groups of 5: id, token, kind, delay_ms, error.
--   kind: 'f' the handler failed (retry while attempts remain), 'r' the handler asked for a retry
--   (Retry(delay)), 'p' permanent failure (dead now). delay_ms: computed by the caller (full
--   jitter backoff, or the requested delay). error: "type NUL message NUL traceback" (bounded by
--   the caller); the script prefixes the time.
-- Returns: one code per group: 1 scheduled for retry, 2 dead, 0 refused (stale token / not running).
-- Invariants: only the current token holder can fail a job; the job leaves 'i'/'l' and enters
-- exactly one of 't' (or the ready list when the delay is 0) or 'd'. Attempts spent -> dead; a
-- dead job's idempotency key is free again.
local now = now_ms()
local out = {}
local head, earliest = head_score(), nil
for b = 4, #ARGV, 5 do
  local id, token, kind, delay, err = ARGV[b], ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3]), ARGV[b + 4]
  local rec = jget(id)
  if redis.call('HGET', K_L, id) ~= token or not rec then
    out[#out + 1] = 0
  else
    local q = queue_name(rec_qidx(rec)) or '?'
    redis.call('ZREM', K_I, id)
    redis.call('HDEL', K_L, id)
    redis.call('HSET', K_E, id, fmt(now) .. '\0' .. err)
    bump(K_G, 'a:' .. q, -1)
    if kind ~= 'r' then bump(K_C, 'failed:' .. q) end
    if kind == 'p' or rec_attempt(rec) >= rec_max(rec) then
      redis.call('ZADD', K_D, now, id)
      release_key(id, rec)  -- a key names a live job: once dead, scheduling with it makes a new job
      bump(K_G, 'd:' .. q)
      bump(K_C, 'dead:' .. q)
      out[#out + 1] = 2
    else
      bump(K_C, 'retried:' .. q)
      local t = place(id, rec, q, now + math.max(delay, 0), now)
      if t and (earliest == nil or t < earliest) then earliest = t end
      out[#out + 1] = 1
    end
  end
end
settle(earliest, head)
return out
