-- migrate_out: move jobs that belong to another partition under a new partition count into this
-- partition's outbox. Run only by zsched migrate-partitions (scheduler/shell/admin/migrate.py),
-- while the layout fence stands ('layout' = '-' in meta: no tick, claim or schedule runs here).
-- KEYS: the 14 partition keys (see _lib.lua).
-- ARGV: 1-3 common (ARGV[3] without a count: this script is not behind the fence); 4 new partition
--       count N; 5 budget (entries to move in this call); then the outbox fields the caller has
--       delivered (migrate_in ran on their targets), to forget first.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a
--   partition count outside 1-4096, a budget outside 1 to 2^53 - 1, a delivered field that is not
--   'j' and a job id or 'c' and a cron name.
-- Returns: {done, again, field, target, entry, field, target, entry, ...}: done is 1 once every
--   structure was walked and nothing is left to move; again is 1 when the entries are an outbox
--   delivered before (migrate_in must then skip what it already has), 0 when this call took them. Outbox fields are 'j' .. id (a job or a
--   finished job's summary) or 'c' .. name (a cron); target = the partition it belongs to under
--   N; entry = cmsgpack {kind, ...} (below), read by migrate_in.
-- Retry safety: what this call took stays in the outbox PREFIX.."mo" until a later call names it
--   delivered; while the outbox holds anything, a call moves nothing new and returns the outbox,
--   so a lost reply or a crashed caller re-sends the same entries (migrate_in skips ids it has).
-- Invariants: a job leaves its state here only into the outbox, in the same script; at every
--   moment a job is in exactly one of: its state here, this outbox, its state in the target.
--   Running jobs ('i') are left alone: they finish here, and a later pass moves what they left.
--   Walk order: crons, timers 't', dead 'd', summaries 'f', then per queue held 'h:Q' and ready
--   'r:Q'; the position is kept in meta 'mstage'/'mcur' so every call does bounded work. A ready
--   list is rotated (staying ids go back to its head in order), so after one full turn the jobs
--   that stay keep their order.
-- Entries: t {'t', score, queue, record, error, key}; r {'r', due, queue, record, error, key};
--   h {'h', score, queue, record, error, key, due}; d {'d', score, queue, record, error, due};
--   f {'f', summary, queue}; c {'c', fields (flat HGETALL)}. error/key: '' when none.
-- Uses: COMMON, ID_LEN, K_D, K_E, K_F, K_G, K_J, K_K, K_M, K_META, K_Q, K_T, MAX_INT, NAME_MAX,
--       PART, PREFIX, arg, bump, flush_bumps, fmt, jget, multi, queue_name, rec_opts, rec_qidx,
--       rec_valid, refusal, remove_timer, u16, u32
if not (COMMON and #KEYS == 14) then return arg('common', 14) end
local N, budget = arg('int', 4, 'partitions', 1, 4096), arg('int', 5, 'budget', 1, MAX_INT)
local delivered = {}
for i = 6, #ARGV do
  local f = ARGV[i]
  if not ((#f == ID_LEN + 1 and string.byte(f) == 106) or (#f <= NAME_MAX + 1 and string.find(f, '^c[A-Za-z0-9][A-Za-z0-9_.%-]*$'))) then
    arg('refuse', i, 'field', "an outbox field: 'j' and a job id (15 bytes), or 'c' and a cron name", f)
  end
  delivered[#delivered + 1] = f
end
if refusal then return refusal end
local OUT = PREFIX .. 'mo'
local me = tonumber(PART)
if #delivered > 0 then multi('HDEL', OUT, delivered) end
local left = redis.call('HGETALL', OUT)
if #left > 0 then
  local out = {0, 1}
  for i = 1, #left, 2 do
    local f, target = left[i], 0
    if string.sub(f, 1, 1) == 'j' then
      target = u32(f, 8) % N  -- 'j' .. id: h is at bytes 7-10 of the id
    else
      local e = cmsgpack.unpack(left[i + 1])
      for k = 1, #e[2], 2 do if e[2][k] == 'h' then target = tonumber(e[2][k + 1]) % N end end
    end
    out[#out + 1] = f; out[#out + 1] = target; out[#out + 1] = left[i + 1]
  end
  return out
end

local function target_of(id) return u32(id, 7) % N end
local out = {0, 0}
local moved = 0
local function emit(field, target, entry)
  local packed = cmsgpack.pack(entry)
  redis.call('HSET', OUT, field, packed)
  out[#out + 1] = field; out[#out + 1] = target; out[#out + 1] = packed
  moved = moved + 1
end
-- what goes with a live job: its last error and, for a keyed job, its idempotency key
local function take_extras(id, rec)
  local err = redis.call('HGET', K_E, id)
  if err then redis.call('HDEL', K_E, id) end
  local key = ''
  if rec_valid(rec) then
    local _, _, k = rec_opts(rec)
    if k and redis.call('HGET', K_K, k) == id then redis.call('HDEL', K_K, k); key = k end
  end
  return err or '', key
end

local stages = {'crons', 't', 'd', 'f'}
local names = {}
local qh = redis.call('HGETALL', K_Q)
for i = 1, #qh, 2 do
  if string.sub(qh[i], 1, 2) == 'n:' then names[#names + 1] = string.sub(qh[i], 3) end
end
table.sort(names)
for _, q in ipairs(names) do stages[#stages + 1] = 'h:' .. q; stages[#stages + 1] = 'r:' .. q end

local pos = redis.call('HMGET', K_META, 'mstage', 'mcur')
local stage, cur = pos[1], pos[2] or '0'
local si = 1
if stage == 'done' then si = #stages + 1 end
for i, st in ipairs(stages) do if st == stage then si = i end end

-- A zset walked by rank: 'cur' counts the members that stay, which all sit before it. Returns
-- true when the walk reached the end (the range came back shorter than asked).
local function walk_zset(key, kind, q)
  local at, want = tonumber(cur), budget - moved
  local got = redis.call('ZRANGE', key, at, at + want - 1, 'WITHSCORES')
  for i = 1, #got, 2 do
    local member, score = got[i], tonumber(got[i + 1])
    local id = string.sub(member, 1, ID_LEN)
    local target = target_of(id)
    if target == me then
      at = at + 1
    elseif kind == 't' then
      local rec = string.sub(member, ID_LEN + 1)
      local qn = queue_name(K_Q, rec_qidx(rec)) or '?'
      remove_timer(K_T, K_M, id, member)
      bump(K_G, 's:' .. qn, -1)
      local err, key = take_extras(id, rec)
      emit('j' .. id, target, {'t', score, qn, rec, err, key})
    else
      local rec, due = jget(K_J, id)
      if not rec then
        at = at + 1 -- no body (only a hand edit makes one): left where it is, never dropped
      else
        redis.call('ZREM', key, id)
        redis.call('HDEL', K_J, id)
        local qn = q or queue_name(K_Q, rec_qidx(rec)) or '?'
        if kind == 'd' then
          bump(K_G, 'd:' .. qn, -1)
          local err = redis.call('HGET', K_E, id) or ''
          redis.call('HDEL', K_E, id)
          emit('j' .. id, target, {'d', score, qn, rec, err, due})
        else
          bump(K_G, 's:' .. qn, -1); bump(K_G, 'h:' .. qn, -1)
          local err, k = take_extras(id, rec)
          emit('j' .. id, target, {'h', score, qn, rec, err, k, due})
        end
      end
    end
  end
  cur = fmt(at)
  return #got / 2 < want
end

while si <= #stages and moved < budget do
  local s = stages[si]
  local finished = false
  if s == 'crons' then
    for _, name in ipairs(redis.call('SMEMBERS', PREFIX .. 'crons')) do
      local ck = PREFIX .. 'cron:' .. name
      local h = redis.call('HGET', ck, 'h')
      if h and tonumber(h) % N ~= me then
        local fields = redis.call('HGETALL', ck)
        redis.call('DEL', ck)
        redis.call('SREM', PREFIX .. 'crons', name)
        emit('c' .. name, tonumber(h) % N, {'c', fields})
      end
    end
    finished = true
  elseif s == 't' or s == 'd' then
    finished = walk_zset(s == 't' and K_T or K_D, s, nil)
  elseif s == 'f' then
    local r = redis.call('HSCAN', K_F, cur, 'COUNT', budget)
    for i = 1, #r[2], 2 do
      local id, v = r[2][i], r[2][i + 1]
      if #id == ID_LEN and target_of(id) ~= me then
        redis.call('HDEL', K_F, id)
        emit('j' .. id, target_of(id), {'f', v, queue_name(K_Q, u16(v, 14)) or '?'})
      end
    end
    cur = r[1]
    finished = cur == '0'
  elseif string.sub(s, 1, 2) == 'h:' then
    finished = walk_zset(PREFIX .. s, 'h', string.sub(s, 3))
  else -- 'r:Q': rotate; cur = ids still to visit ('start' before the first visit)
    local list, qn = PREFIX .. s, string.sub(s, 3)
    local remaining = tonumber(cur)
    if remaining == nil then remaining = redis.call('LLEN', list) end
    local n = math.min(remaining, budget - moved)
    for _ = 1, n do
      local id = redis.call('RPOP', list)
      if not id then remaining = 0; break end
      remaining = remaining - 1
      local target = target_of(id)
      if target == me or #id ~= ID_LEN then
        redis.call('LPUSH', list, id)
      else
        local rec, due = jget(K_J, id)
        if rec then
          redis.call('HDEL', K_J, id)
          local err, key = take_extras(id, rec)
          emit('j' .. id, target, {'r', due, qn, rec, err, key})
        else
          redis.call('LPUSH', list, id) -- no body: left where it is, never dropped
        end
      end
    end
    cur = fmt(remaining)
    finished = remaining <= 0
  end
  stage = s
  if finished then
    si = si + 1
    stage, cur = stages[si] or 'done', '0'
    if string.sub(stage, 1, 2) == 'r:' then cur = 'start' end
  end
end
redis.call('HSET', K_META, 'mstage', stage or stages[1], 'mcur', cur)
flush_bumps()
if si > #stages and moved == 0 then out[1] = 1 end
return out
