-- registry_leave: remove one worker process from the namespace's worker registry (its graceful
-- stop, workers/presence.py). Not a job transition: no job's state is read or written.
-- KEYS: 1 records hash "{ns}:workers"; 2 liveness sorted set "{ns}:workers:live" (see
--       lua/registry_beat.lua). Hash tag {ns}: one cluster slot.
-- ARGV: 1 worker id.
-- Returns: 1 when the worker's record was removed, 0 when there was none.
-- Invariants: the id leaves both keys at once; O(log N). Idempotent: a re-send finds nothing.
local gone = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return gone
