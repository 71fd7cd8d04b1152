-- epoch_reset: forget the highest scheduler epoch a partition has seen (operator repair after an
-- epoch conflict: etcd was restored or replaced, so every epoch it hands out now is older than
-- meta.epoch and every tick is refused). Run by `zsched epochs reset`, never by the tier itself.
-- KEYS: the 14 partition keys (see _lib.lua); only K_META (field 'epoch') is read or written.
-- ARGV: 1-3 common; 4 expected epoch: the value the operator saw (decimal; 0 = none stored).
-- Publishes: the partition number on CHAN.."epoch-reset" after a reset (publish(): SPUBLISH in
-- sharded mode), so a replica backing off from the conflict retries at once instead of at its
-- next backoff step (up to 30 s later).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, an
--   expected epoch outside 0 to 2^53 - 1, more arguments.
-- Returns: {1, previous epoch} reset to 0; {0, current epoch} not reset because the stored value
--          is no longer the expected one (a legitimate owner raised it meanwhile: look again);
--          {2, 0} nothing to do (nothing or 0 stored, as expected).
-- Invariants: compare-and-set in one script, so a concurrent update of meta.epoch is never
-- clobbered. Only meta.epoch changes: jobs, timers, leases and the claim fence counter are untouched.
-- With 0 stored the next owner's tick re-establishes its epoch. Safe even if a stale replica
-- ticks first: tick pops and pushes due timers in one script, so two ticking replicas can only
-- contend for jobs, never fire one twice.
-- Uses: CHAN, COMMON, K_META, MAX_INT, PART, arg, publish, refusal
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local expected = arg('int', 4, 'expected_epoch', 0, MAX_INT)
arg('at_most', 4)
if refusal then return refusal end
local cur = tonumber(redis.call('HGET', K_META, 'epoch') or '0')
if cur ~= expected then return {0, cur} end
if cur == 0 then return {2, 0} end
redis.call('HSET', K_META, 'epoch', '0')
publish(CHAN, 'epoch-reset', PART)
return {1, cur}
