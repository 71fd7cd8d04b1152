-- fail: running -> scheduled (retry after a delay) or running -> dead. Run by workers.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; then groups of 5: id, token, kind, delay_ms, error.
--   kind: 'f' the handler failed (retry while attempts remain), 'r' the handler asked for a retry
--   (Retry(delay)), 'p' permanent failure (dead now). delay_ms: computed by the caller (full
--   jitter backoff, or the requested delay). error: "type NUL message NUL traceback" (bounded by
--   the caller); the script prefixes the time.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, no
--   group or part of one, an id that is not 15 bytes, a token that is not an integer from 1 to
--   2^53 - 1, a kind other than f, r, p, a delay_ms outside 0 to 9999-12-31 in ms, an error longer
--   than 16386 bytes (calls.error_arg: 4096 characters of UTF-8 and two NULs).
-- Returns: one code per group: 1 scheduled for retry, 2 dead, 0 refused (stale token / not running).
-- Invariants: only the current token holder can fail a job; the job leaves 'i'/'l' and enters
-- exactly one of 't' (or the ready list when the delay is 0) or 'd'. Attempts spent -> dead; a
-- dead job's idempotency key is free again.
-- Arguments: tested inline (a worker fails every job whose handler raised), named through arg
-- when the test failed. The two lists go together.
-- Uses: CHAN, COMMON, ID_LEN, K_C, K_D, K_E, K_G, K_I, K_J, K_K, K_L, K_Q, K_T, MAX_INT, MAX_MS,
--       PART, PREFIX, arg, bump, fmt, head_score, jget, now_ms, place, queue_name, rec_attempt,
--       rec_max, rec_qidx, refusal, release_key, settle, tally
local ERROR_MAX = 16386
local A = ARGV
local good = COMMON and #KEYS == 14 and #A >= 8 and (#A - 3) % 5 == 0
for b = 4, good and #A or 0, 5 do
  local t, k, d = tonumber(A[b + 1]), A[b + 2], tonumber(A[b + 3])
  if not (#A[b] == ID_LEN and t and t >= 1 and t <= MAX_INT and t % 1 == 0 and (k == 'f' or k == 'r' or k == 'p') and
      d and d >= 0 and d <= MAX_MS and d % 1 == 0 and #A[b + 4] <= ERROR_MAX) then
    good = false
  end
end
if not good then
  if not (COMMON and #KEYS == 14) then return arg('common', 14) end
  arg('groups', 4, '(id, token, kind, delay_ms, error) groups', 5, 1)
  for b = 4, #A - 4, 5 do
    arg('id', b)
    arg('token', b + 1)
    local k = A[b + 2]
    if k ~= 'f' and k ~= 'r' and k ~= 'p' then arg('refuse', b + 2, 'kind', "'f', 'r' or 'p'", k) end
    arg('int', b + 3, 'delay_ms', 0, MAX_MS)
    if #A[b + 4] > ERROR_MAX then arg('refuse', b + 4, 'error', 'at most 16386 bytes (calls.error_arg)', A[b + 4]) end
  end
  return refusal
end
local now = now_ms()
local out = {}
local head, earliest = head_score(K_T), nil
for b = 4, #ARGV, 5 do
  local id, token, kind, delay, err = ARGV[b], ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3]), ARGV[b + 4]
  local rec = jget(K_J, id)
  if redis.call('HGET', K_L, id) ~= token or not rec then
    out[#out + 1] = 0
  else
    local q = queue_name(K_Q, rec_qidx(rec)) or '?'
    redis.call('ZREM', K_I, id)
    redis.call('HDEL', K_L, id)
    redis.call('HSET', K_E, id, fmt(now) .. '\0' .. err)
    bump(K_G, 'a:' .. q, -1)
    if kind ~= 'r' then tally(K_C, PREFIX, 'failed:' .. q, 1, now) end
    if kind == 'p' or rec_attempt(rec) >= rec_max(rec) then
      redis.call('ZADD', K_D, now, id)
      release_key(K_K, id, rec)  -- a key names a live job: once dead, scheduling with it makes a new job
      bump(K_G, 'd:' .. q)
      tally(K_C, PREFIX, 'dead:' .. q, 1, now)
      out[#out + 1] = 2
    else
      bump(K_C, 'retried:' .. q)
      local t = place(id, rec, q, now + math.max(delay, 0), now)
      if t and (earliest == nil or t < earliest) then earliest = t end
      out[#out + 1] = 1
    end
  end
end
settle(CHAN, PREFIX, PART, earliest, head, now)
return out
