-- extend: lease heartbeat (running -> running with a later deadline). Run by workers.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; then triples: id, token, lease_ms (0 = the job's own lease).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, no
--   triple or part of one, an id that is not 15 bytes, a token that is not an integer from 1 to
--   2^53 - 1, a lease_ms outside 0 to 7 days (options.MAX_LEASE_S).
-- Returns: one value per triple: the new deadline ms, or 0 when refused (stale token: the lease
-- was lost; the worker must not assume it still owns the job).
-- Invariants: only the current token holder can extend; a refused extend changes nothing.
-- Arguments: tested inline (heartbeats extend every running job), named through arg when the test
-- failed. The two lists go together.
-- Uses: COMMON, ID_LEN, K_I, K_J, K_L, MAX_INT, arg, jget, now_ms, rec_opts, refusal
local MAX_LEASE_MS = 604800000 -- options.MAX_LEASE_S
local A = ARGV
local good = COMMON and #KEYS == 14 and #A >= 6 and #A % 3 == 0
for b = 4, good and #A or 0, 3 do
  local t, l = tonumber(A[b + 1]), tonumber(A[b + 2])
  if not (#A[b] == ID_LEN and t and t >= 1 and t <= MAX_INT and t % 1 == 0 and l and l >= 0 and l <= MAX_LEASE_MS and
      l % 1 == 0) then
    good = false
  end
end
if not good then
  if not (COMMON and #KEYS == 14) then return arg('common', 14) end
  arg('groups', 4, '(id, token, lease_ms) triples', 3, 1)
  for b = 4, #A - 2, 3 do arg('id', b); arg('token', b + 1); arg('int', b + 2, 'lease_ms', 0, MAX_LEASE_MS) end
  return refusal
end
local now = now_ms()
local out = {}
for b = 4, #ARGV, 3 do
  local id, token, lease = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2])
  local rec = jget(K_J, id)
  if redis.call('HGET', K_L, id) ~= token or not rec then
    out[#out + 1] = 0
  else
    if lease <= 0 then
      local _
      _, lease = rec_opts(rec)
    end
    redis.call('ZADD', K_I, 'XX', now + lease, id)
    out[#out + 1] = now + lease
  end
end
return out
