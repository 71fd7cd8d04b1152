-- migrate_in: take jobs moved out of other partitions (migrate_out's outbox entries) into this
-- partition, in the state they left. Run only by zsched migrate-partitions, behind the layout fence.
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common (no count: not behind the fence); 4 cron sequence floor (the largest 'cronseq'
--       of the sources, so ids this partition makes for crons never repeat one made there);
--       5 check flag: 1 when the entries may have been delivered before (an outbox re-sent after
--       an interruption, or this call re-sent after a lost reply), 0 for a first delivery;
--       then pairs: outbox field ('j' .. id or 'c' .. name), entry (cmsgpack, see migrate_out.lua).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a cron
--   sequence floor outside 0 to 2^53 - 1, a check flag other than 0 or 1, half a pair, a field
--   that is not 'j' and a job id or 'c' and a cron name, an entry that is not migrate_out's for
--   its field (cmsgpack, its kind's fields and types). Every entry is checked before the first is
--   written.
-- Returns: {taken, skipped}: entries written, and entries already here (a re-sent delivery).
-- Retry safety: with the check flag, an entry whose job (any state, or its finished summary) or
--   cron is already here is skipped, so delivering an outbox twice changes nothing; a first
--   delivery skips the lookups (ids are unique and a job is in one partition). Running jobs never
--   move, so an id cannot be running here.
-- Invariants: a job enters exactly the state it left (timer with its score, ready list, held
--   set, dead set, or a finished summary) with its record's queue index translated to this
--   partition's; a keyed job takes its idempotency key along; gauges follow the job.
-- Re-send flag: ARGV[5]
-- Uses: CHAN, COMMON, ID_LEN, KEY_MAX, K_D, K_E, K_F, K_G, K_I, K_J, K_K, K_M, K_META, K_Q, K_T,
--       MAX_INT, MAX_MS, NAME_MAX, NAME_PATTERN, PART, PREFIX, arg, bump, flag, fmt, head_score,
--       job_exists, jval, multi, p16, push_ready, put_timer, queue_index, refusal, settle
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local seq_floor, check = arg('int', 4, 'cron_sequence', 0, MAX_INT), arg('flag', 5, 'check')
arg('groups', 6, '(field, entry) pairs', 2, 0)
-- Every entry is decoded and checked before the first is written: a field 'j' .. id (15 bytes)
-- with a job entry, or 'c' .. name with a cron entry, in migrate_out's layout (above).
local entries = {}
local function number(v) return type(v) == 'number' and v >= 0 and v <= MAX_MS and v % 1 == 0 end
local function text(v, most) return type(v) == 'string' and #v <= most end
local function queue_ok(v) return v == '?' or (text(v, NAME_MAX) and string.find(v, NAME_PATTERN)) end
for i = 6, refusal and 0 or #ARGV - 1, 2 do
  local field = ARGV[i]
  local ok, e = pcall(cmsgpack.unpack, ARGV[i + 1])
  local good = ok and type(e) == 'table'
  local kind = good and e[1]
  if kind == 'c' then
    good = #field <= NAME_MAX + 1 and string.find(field, '^c[A-Za-z0-9][A-Za-z0-9_.%-]*$') and type(e[2]) == 'table' and
      #e[2] % 2 == 0 and #e[2] > 0
    for _, v in ipairs(good and e[2] or {}) do good = good and type(v) == 'string' end
  elseif good then
    good = #field == ID_LEN + 1 and string.byte(field) == 106 and number(e[2]) and queue_ok(e[3]) and text(e[4], 1e9) and
      #e[4] >= 2 and text(e[5], 1e9)
    if kind == 't' or kind == 'r' then
      good = good and text(e[6], KEY_MAX)
    elseif kind == 'h' then
      good = good and text(e[6], KEY_MAX) and number(e[7])
    elseif kind == 'd' then
      good = good and number(e[6])
    elseif kind == 'f' then
      good = #field == ID_LEN + 1 and string.byte(field) == 106 and type(e[2]) == 'string' and #e[2] >= 28 and queue_ok(e[3])
    else
      good = false
    end
  end
  if not good then
    arg('refuse', i + 1, 'entry', "an outbox entry of migrate_out (cmsgpack, its kind's layout) for field ARGV[" ..
      fmt(i) .. ']', ARGV[i + 1])
    break
  end
  entries[i] = e
end
if refusal then return refusal end
if seq_floor > tonumber(redis.call('HGET', K_META, 'cronseq') or '0') then
  redis.call('HSET', K_META, 'cronseq', fmt(seq_floor))
end
local taken, skipped = 0, 0
local head = head_score(K_T)
local earliest = nil
local function local_rec(rec, qn) return p16(queue_index(PREFIX, K_Q, qn)) .. string.sub(rec, 3) end
local function put_extras(id, err, key)
  if err ~= '' then redis.call('HSET', K_E, id, err) end
  if key ~= '' then redis.call('HSET', K_K, key, id) end
end
for i = 6, #ARGV, 2 do
  local field, e = ARGV[i], entries[i]
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
      redis.call('HSET', K_F, id, string.sub(v, 1, 13) .. p16(queue_index(PREFIX, K_Q, e[3])) .. string.sub(v, 16))
      taken = taken + 1
    else
      local qn, rec = e[3], local_rec(e[4], e[3])
      if kind == 't' then
        put_timer(K_T, K_M, id, rec, e[2])
        bump(K_G, 's:' .. qn)
        if earliest == nil or e[2] < earliest then earliest = e[2] end
        put_extras(id, e[5], e[6])
      elseif kind == 'r' then
        redis.call('HSET', K_J, id, jval(rec, e[2]))
        push_ready(PREFIX, id, qn, false)
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
settle(CHAN, PREFIX, PART, earliest, head)
return {taken, skipped}
