-- epoch_reset: forget the highest scheduler epoch a partition has seen (operator repair after an
-- epoch conflict: etcd was restored or replaced, so every epoch it hands out now is older than
-- meta.epoch and every tick is refused). Run by `zsched epochs reset`, never by the tier itself.
-- KEYS: the 14 partition keys (see _lib.lua); only K_META (field 'epoch') is read or written.
-- ARGV: 1-3 common; 4 expected epoch: the value the operator saw (decimal; 0 = none stored).
-- Publishes: the partition number on CHAN.."epoch-reset" after a reset (publish(): SPUBLISH in
-- sharded mode), so a replica backing off from the conflict retries at once instead of at its
-- next backoff step (up to 30 s later).
-- Returns: {1, previous epoch} reset to 0; {0, current epoch} not reset because the stored value
--          is no longer the expected one (a legitimate owner raised it meanwhile: look again);
--          {2, 0} nothing to do (nothing or 0 stored, as expected).
-- Invariants: compare-and-set in one script, so a concurrent update of meta.epoch is never
-- clobbered. Only meta.epoch changes: jobs, timers, leases and the claim fence counter are untouched.
-- With 0 stored the next owner's tick re-establishes its epoch. Safe even if a stale replica
-- ticks first: tick pops and pushes due timers in one script, so two ticking replicas can only
-- contend for jobs, never fire one twice.
local expected = tonumber(ARGV[4])
if not expected or expected < 0 or expected ~= math.floor(expected) then
  return redis.error_reply('zsched: epoch_reset: expected epoch must be an integer >= 0, got ' .. tostring(ARGV[4]))
end
local cur = tonumber(redis.call('HGET', K_META, 'epoch') or '0')
if cur ~= expected then return {0, cur} end
if cur == 0 then return {2, 0} end
redis.call('HSET', K_META, 'epoch', '0')
publish(CHAN .. 'epoch-reset', PART)
return {1, cur}
