-- extend: lease heartbeat (running -> running with a later deadline). Run by workers.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common; then triples: id, token, lease_ms (0 = the job's own lease).
-- Returns: one value per triple: the new deadline ms, or 0 when refused (stale token: the lease
-- was lost; the worker must not assume it still owns the job).
-- Invariants: only the current token holder can extend; a refused extend changes nothing.
local now = now_ms()
local out = {}
for b = 4, #ARGV, 3 do
  local id, token, lease = ARGV[b], ARGV[b + 1], tonumber(ARGV[b + 2])
  local rec = jget(id)
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
