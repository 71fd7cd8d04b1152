-- ack: running -> done. Run by workers after a handler returned.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; 4 tombstone ttl ms (0 = keep none); then pairs: id, token.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a
--   tombstone_ttl_ms outside 0 to 9999-12-31 in ms, no pair or half a pair, an id that is not 15
--   bytes, a token that is not an integer from 1 to 2^53 - 1.
-- Returns: one code per pair: 1 acked, 0 refused (token stale: the lease was lost and the job
-- was reaped, maybe claimed again; or the job is not running).
-- Invariants: only the holder of the current token can finish a job; a refused ack changes
-- nothing. An acked job leaves 'i', 'l', 'j', 'e', frees its idempotency key and, with ttl > 0,
-- leaves a 'done' summary in 'f' (attempts, due time of this attempt, queue, key, created, last
-- error of an earlier attempt). Expired summaries are trimmed as it goes: 4 entries of 'f' are
-- visited per job acked (sweep_after_tombstones), so trimming keeps up with any ack rate.
-- Arguments: tested inline (a worker acks every job: no call or closure for a good ack), named
-- through arg when the test failed. The two lists go together.
-- Uses: COMMON, ID_LEN, K_C, K_E, K_F, K_G, K_I, K_J, K_K, K_L, K_META, K_Q, MAX_INT, MAX_MS,
--       PREFIX, arg, bump, flush_bumps, jget, now_ms, queue_name, rec_qidx, refusal, release_key,
--       sweep_after_tombstones, tally, tombstone, touch_queue
local A = ARGV
local ttl = tonumber(A[4] or '')
local good = COMMON and #KEYS == 14 and ttl and ttl >= 0 and ttl <= MAX_MS and ttl % 1 == 0 and #A >= 6 and #A % 2 == 0
for b = 5, good and #A or 0, 2 do
  local t = tonumber(A[b + 1])
  if not (#A[b] == ID_LEN and t and t >= 1 and t <= MAX_INT and t % 1 == 0) then good = false end
end
if not good then
  if not (COMMON and #KEYS == 14) then return arg('common', 14) end
  arg('int', 4, 'tombstone_ttl_ms', 0, MAX_MS)
  arg('groups', 5, '(id, token) pairs', 2, 1)
  for b = 5, #A - 1, 2 do arg('id', b); arg('token', b + 1) end
  return refusal
end
local now = now_ms()
local out, active = {}, {}
for b = 5, #ARGV, 2 do
  local id, token = ARGV[b], ARGV[b + 1]
  if redis.call('HGET', K_L, id) ~= token then
    out[#out + 1] = 0
  else
    local rec, due = jget(K_J, id)
    redis.call('ZREM', K_I, id)
    redis.call('HDEL', K_L, id)
    redis.call('HDEL', K_J, id)
    tombstone(K_E, K_F, id, 'd', now, ttl, rec, due) -- also drops its last error
    if rec then
      release_key(K_K, id, rec)
      local q = queue_name(K_Q, rec_qidx(rec)) or '?'
      bump(K_G, 'a:' .. q, -1)
      tally(K_C, PREFIX, 'acked:' .. q, 1, now)
      active[rec_qidx(rec)] = true
    end
    out[#out + 1] = 1
  end
end
flush_bumps()
for idx in pairs(active) do touch_queue(K_Q, idx, now) end -- activity keeps a queue name from retiring
sweep_after_tombstones(K_META, K_F, now)
return out
