-- registry_read: the live workers of the namespace's worker registry, for zsched workers, zsched
-- stats and the replica that exports the registry as metrics (scheduler/protocol/registry.py
-- parses the reply). Deletes records whose time is up on the way. Not a job transition.
-- KEYS: 1 records hash "{ns}:workers"; 2 liveness sorted set "{ns}:workers:live" (see
--       lua/registry_beat.lua). Hash tag {ns}: one cluster slot.
-- ARGV: 1 prune: how many dead records to delete in this call (0 to 1000).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): KEYS that are not the
--   namespace's "{NS}:workers" and "{NS}:workers:live", a prune count outside 0-1000, more
--   arguments.
-- Returns: {now_ms, pruned, id_1, deadline_ms_1, value_1, id_2, ...}: Redis's clock, how many dead
--          records were deleted, then per live worker (deadline > now) its id, liveness deadline
--          and stored value ("LAST_MS:" .. msgpack record), longest-lived deadline last. A live id
--          without a record (only a hand edit makes one) is left out.
-- Invariants: writes only the deletion of dead records, bounded by ARGV[1] (the rest go on the
-- next call); reads O(live workers), never anything per job or per partition.
-- Uses: arg, now_ms, refusal, registry_keys, registry_prune
local k_records, k_live = registry_keys()
local prune = arg('int', 1, 'prune', 0, 1000)
arg('at_most', 1)
if refusal then return refusal end
local now = now_ms()
local out = {now, registry_prune(k_records, k_live, now, prune)}
local live = redis.call('ZRANGEBYSCORE', k_live, '(' .. now, '+inf', 'WITHSCORES')
if #live == 0 then return out end
-- HMGET in chunks: unpack() of thousands of ids would overflow Lua's C stack
for first = 1, #live, 1000 do
  local ids = {}
  for i = first, math.min(first + 999, #live), 2 do ids[#ids + 1] = live[i] end
  local values = redis.call('HMGET', k_records, unpack(ids))
  for j = 1, #ids do
    if values[j] then
      out[#out + 1] = ids[j]
      out[#out + 1] = live[first + 2 * j - 1]
      out[#out + 1] = values[j]
    end
  end
end
return out
