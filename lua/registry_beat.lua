-- registry_beat: register or refresh one worker process in the namespace's worker registry
-- (workers/presence.py sends it when the worker starts and every registry_interval seconds;
-- record layout and limits in scheduler/protocol/registry.py). Not a job transition: no job's
-- state is read or written.
-- KEYS: 1 records hash "{ns}:workers" (worker id -> "LAST_MS:" .. msgpack record); 2 liveness
--       sorted set "{ns}:workers:live" (worker id -> ms until which the record counts as live).
--       Both carry the hash tag {ns}: one cluster slot.
-- ARGV: 1 worker id (host-pid-random, 1-200 bytes); 2 the record (msgpack, 1-8192 bytes);
--       3 ttl ms: how long the record counts as live without another beat (3 registry intervals,
--       1 to 86 400 000); 4 prune: how many dead records of other workers to delete on the way
--       (0 to 16).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): KEYS that are not the
--   namespace's "{NS}:workers" and "{NS}:workers:live" (NS a namespace name), a worker id outside
--   1-200 bytes, a record outside 1-8192 bytes, a ttl outside 1 to 86400000 ms, a prune count
--   outside 0-16, more arguments.
-- Returns: {now_ms, pruned}: Redis's clock when the record was written, and how many dead records
--          were deleted.
-- Invariants: a worker id is in both keys or in neither; the record's LAST_MS and its liveness
-- deadline come from Redis's clock (TIME), never from the worker's. O(log N + prune) work per call,
-- whatever the number of workers, partitions or jobs. Both keys expire a day (the longest ttl
-- allowed) after the last beat of any worker: never under a live record, and nothing is left
-- behind once every worker of the namespace is gone.
-- Idempotent: a re-send writes the same record with a later clock.
-- Uses: arg, now_ms, refusal, registry_keys, registry_prune
local k_records, k_live = registry_keys()
local id, rec = ARGV[1], ARGV[2]
if not id or #id < 1 or #id > 200 then arg('refuse', 1, 'worker id', 'a worker id of 1-200 bytes', id) end
if not rec or #rec < 1 or #rec > 8192 then arg('refuse', 2, 'record', 'a record of 1-8192 bytes', rec) end
local ttl, prune = arg('int', 3, 'ttl_ms', 1, 86400000), arg('int', 4, 'prune', 0, 16)
arg('at_most', 4)
if refusal then return refusal end
local now = now_ms()
local pruned = registry_prune(k_records, k_live, now, prune)
redis.call('HSET', k_records, id, now .. ':' .. rec)
redis.call('ZADD', k_live, now + ttl, id)
-- the longest ttl any worker may ask for: no live record is ever lost with its key
redis.call('PEXPIRE', k_records, 86400000)
redis.call('PEXPIRE', k_live, 86400000)
return {now, pruned}
