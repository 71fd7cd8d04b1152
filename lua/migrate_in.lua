-- migrate_in: take jobs moved out of other partitions (migrate_out's outbox entries) into this
-- partition, in the state they left. Run only by zsched migrate-partitions, behind the layout fence.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common (no count: not behind the fence); 4 cron sequence floor (the largest 'cronseq'
--       of the sources, so ids this partition makes for crons never repeat one made there);
--       5 check flag: 1 when the entries may have been delivered before (an outbox re-sent after
--       an interruption, or this call re-sent after a lost reply), 0 for a first delivery;
--       then pairs: outbox field ('j' .. id or 'c' .. name), entry (cmsgpack, see migrate_out.lua).
-- Returns: {taken, skipped}: entries written, and entries already here (a re-sent delivery).
-- Retry safety: with the check flag, an entry whose job (any state, or its finished summary) or
--   cron is already here is skipped, so delivering an outbox twice changes nothing; a first
--   delivery skips the lookups (ids are unique and a job is in one partition). Running jobs never
--   move, so an id cannot be running here.
-- Invariants: a job enters exactly the state it left (timer with its score, ready list, held
--   set, dead set, or a finished summary) with its record's queue index translated to this
--   partition's; a keyed job takes its idempotency key along; gauges follow the job.
local seq_floor, check = tonumber(ARGV[4]), ARGV[5] == '1'
if seq_floor > tonumber(redis.call('HGET', K_META, 'cronseq') or '0') then
  redis.call('HSET', K_META, 'cronseq', fmt(seq_floor))
end
local taken, skipped = 0, 0
local head = head_score()
local earliest = nil
local function local_rec(rec, qn) return p16(queue_index(qn)) .. string.sub(rec, 3) end
local function put_extras(id, err, key)
  if err ~= '' then redis.call('HSET', K_E, id, err) end
  if key ~= '' then redis.call('HSET', K_K, key, id) end
end
for i = 6, #ARGV, 2 do
  local field, e = ARGV[i], cmsgpack.unpack(ARGV[i + 1])
  local kind = e[1]
  if kind == 'c' then
    local name = string.sub(field, 2)
    local ck = PREFIX .. 'cron:' .. name
    if check and redis.call('EXISTS', ck) == 1 then
      skipped = skipped + 1
    else
      multi('HSET', ck, e[2])
      redis.call('SADD', PREFIX .. 'crons', name)
      taken = taken + 1
    end
  else
    local id = string.sub(field, 2)
    if check and (job_exists(id) or redis.call('ZSCORE', K_I, id)) then
      skipped = skipped + 1
    elseif kind == 'f' then
      local v = e[2]
      redis.call('HSET', K_F, id, string.sub(v, 1, 13) .. p16(queue_index(e[3])) .. string.sub(v, 16))
      taken = taken + 1
    else
      local qn, rec = e[3], local_rec(e[4], e[3])
      if kind == 't' then
        put_timer(id, rec, e[2])
        bump(K_G, 's:' .. qn)
        if earliest == nil or e[2] < earliest then earliest = e[2] end
        put_extras(id, e[5], e[6])
      elseif kind == 'r' then
        redis.call('HSET', K_J, id, jval(rec, e[2]))
        push_ready(id, qn, false)
        put_extras(id, e[5], e[6])
      elseif kind == 'h' then
        redis.call('HSET', K_J, id, jval(rec, e[7]))
        redis.call('ZADD', PREFIX .. 'h:' .. qn, e[2], id)
        bump(K_G, 's:' .. qn); bump(K_G, 'h:' .. qn)
        put_extras(id, e[5], e[6])
      elseif kind == 'd' then
        redis.call('HSET', K_J, id, jval(rec, e[6]))
        redis.call('ZADD', K_D, e[2], id)
        bump(K_G, 'd:' .. qn)
        if e[5] ~= '' then redis.call('HSET', K_E, id, e[5]) end
      else
        error('zsched: migrate_in got an entry of unknown kind ' .. tostring(kind))
      end
      taken = taken + 1
    end
  end
end
settle(earliest, head)
return {taken, skipped}
