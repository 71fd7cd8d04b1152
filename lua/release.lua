-- release: running -> ready, without spending an attempt (graceful worker shutdown hands back
-- jobs it did not finish).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; then pairs: id, token.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, no
--   pair or half a pair, an id that is not 15 bytes, a token that is not an integer from 1 to
--   2^53 - 1.
-- Returns: one code per pair: 1 released, 0 refused (stale token / not running).
-- Invariants: the job leaves 'i'/'l' and goes to the front of its ready list with attempt - 1.
-- Arguments: tested inline (a worker that stops releases every job it holds), named through arg
-- when the test failed. The two lists go together.
-- Uses: CHAN, COMMON, ID_LEN, K_C, K_G, K_I, K_J, K_L, K_Q, MAX_INT, PART, PREFIX, arg, bump,
--       flush_bumps, jget, jval, publish_ready, push_ready, queue_name, rec_attempt, rec_qidx,
--       rec_with_attempt, refusal
local A = ARGV
local good = COMMON and #KEYS == 14 and #A >= 5 and #A % 2 == 1
for b = 4, good and #A or 0, 2 do
  local t = tonumber(A[b + 1])
  if not (#A[b] == ID_LEN and t and t >= 1 and t <= MAX_INT and t % 1 == 0) then good = false end
end
if not good then
  if not (COMMON and #KEYS == 14) then return arg('common', 14) end
  arg('groups', 4, '(id, token) pairs', 2, 1)
  for b = 4, #A - 1, 2 do arg('id', b); arg('token', b + 1) end
  return refusal
end
local out = {}
for b = 4, #ARGV, 2 do
  local id, token = ARGV[b], ARGV[b + 1]
  local rec, due = jget(K_J, id)
  if redis.call('HGET', K_L, id) ~= token or not rec then
    out[#out + 1] = 0
  else
    local q = queue_name(K_Q, rec_qidx(rec)) or '?'
    local a = rec_attempt(rec)
    if a > 0 then rec = rec_with_attempt(rec, a - 1) end
    redis.call('HSET', K_J, id, jval(rec, due))
    redis.call('ZREM', K_I, id)
    redis.call('HDEL', K_L, id)
    push_ready(PREFIX, id, q, true)
    bump(K_G, 'a:' .. q, -1)
    bump(K_C, 'released:' .. q)
    out[#out + 1] = 1
  end
end
flush_bumps()
publish_ready(CHAN, PREFIX, PART)
return out
