-- registry_leave: remove one worker process from the namespace's worker registry (its graceful
-- stop, workers/presence.py). Not a job transition: no job's state is read or written.
-- KEYS: 1 records hash "{ns}:workers"; 2 liveness sorted set "{ns}:workers:live" (see
--       lua/registry_beat.lua). Hash tag {ns}: one cluster slot.
-- ARGV: 1 worker id.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): KEYS that are not the
--   namespace's "{NS}:workers" and "{NS}:workers:live", a worker id outside 1-200 bytes, more
--   arguments.
-- Returns: 1 when the worker's record was removed, 0 when there was none.
-- Invariants: the id leaves both keys at once; O(log N). Idempotent: a re-send finds nothing.
-- Uses: arg, refusal, registry_keys
local k_records, k_live = registry_keys()
local id = ARGV[1]
if not id or #id < 1 or #id > 200 then arg('refuse', 1, 'worker id', 'a worker id of 1-200 bytes', id) end
arg('at_most', 1)
if refusal then return refusal end
local gone = redis.call('HDEL', k_records, id)
redis.call('ZREM', k_live, id)
return gone
