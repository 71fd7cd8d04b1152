-- _lib_cron.lua: cron helpers (definitions, occurrence tables, advancing a cron), read after
-- _lib_args.lua, _lib.lua and _lib_finish.lua as one library (scheduler/protocol/scripts.py).

-- Cron: definitions live in PREFIX.."cron:"..NAME (fields: def, head, tail, queue, h, times, fires,
-- pending, last, last_at, ver, paused, missed; h = placement hash of the name, the h of every occurrence id;
-- missed = occurrences that did not run at their time since the cron was created: coalesced into a
-- run_late catch-up run or dropped by skip, counted by cron_advance); PREFIX.."crons" is the set of names. 'times'/'fires' hold the
-- upcoming occurrences after the pending one (6-byte nominal / jittered fire ms each), computed
-- by Python (croniter, time zones); Lua only consumes them.
local CRON_TABLE_LOW = 8
local function rec_is_cron(rec) return flag(string.byte(rec, 5), 16) end
local function cron_name_of(rec)
  local _, _, key = rec_opts(rec)
  return key and string.match(key, '^cron:(.+):%d+$')
end
-- Offset (1-based) of a cron record's section: nominal (6 bytes) + missed (2 bytes).
local function cron_section(rec)
  local flags = string.byte(rec, 5)
  local pos = 10
  if flag(flags, 1) then pos = pos + 4 end
  if flag(flags, 8) then pos = pos + 4 end
  return pos + 1 + string.byte(rec, pos)
end
local function cron_rewrite(rec, nominal, missed)
  local c = cron_section(rec)
  return string.sub(rec, 1, c - 1) .. p48(nominal) .. p16(missed) .. string.sub(rec, c + 8)
end
-- Create the cron's pending occurrence (an ordinary job keyed "cron:NAME:NOMINAL").
-- Ambient: it schedules a job: K_K, K_T, K_M, K_J, K_Q and PREFIX's "qfree", K_G, K_C, K_META's
-- cronseq, PART (ids of crons stored before 'h' existed), and CHAN to wake the owner.
local function cron_schedule(ck, name, nominal, fire, missed)
  local c = redis.call('HMGET', ck, 'head', 'tail', 'queue', 'h')
  local key = 'cron:' .. name .. ':' .. fmt(nominal)
  local existing = redis.call('HGET', K_K, key)
  if existing then
    -- adopt it only if it really is this cron's occurrence (e.g. created by a tick that died
    -- before recording it); anything else holding the key loses it
    local member = find_timer(K_T, K_M, existing)
    local erec = member and string.sub(member, ID_LEN + 1) or jget(K_J, existing)
    if erec and rec_is_cron(erec) and cron_name_of(erec) == name then
      redis.call('HSET', ck, 'pending', existing, 'pnom', fmt(nominal))
      return existing
    end
  end
  local seq = redis.call('HINCRBY', K_META, 'cronseq', 1)
  -- Lua-made ids: h = crc32(name), so the occurrence lives where its cron does under any
  -- partition count; top bit of the random part set, so they never collide with client-made ids
  -- (a cron stored before 'h' existed: h = the partition number names this partition too)
  local h = tonumber(c[4] or PART)
  local id = p48(fire) .. p32(h) .. string.char(128 + math.floor(seq / 4294967296) % 128) .. p32(seq % 4294967296)
  local head = c[1]
  local rec = p16(queue_index(PREFIX, K_Q, c[3])) .. string.sub(head, 3, 4) ..
    string.char(string.byte(head, 5) + 4 + 16) .. string.sub(head, 6) .. string.char(#key) .. key .. p48(nominal) .. p16(missed) .. c[2]
  redis.call('HSET', K_K, key, id)
  local h = head_score(K_T)
  redis.call('ZADD', K_T, fire, id .. rec)
  if h == nil or fire < h then wake_scheduler(CHAN, PART) end
  bump(K_G, 's:' .. c[3])
  bump(K_C, 'scheduled:' .. c[3])
  redis.call('HSET', ck, 'pending', id, 'pnom', fmt(nominal))
  return id
end
-- The pending occurrence 'id' fired (or misfired) at 'now': schedule the next future occurrence
-- from the table. Returns the record to fire (run_late: nominal/missed updated when occurrences
-- were missed and are coalesced into this run) and whether the runner must refill the table.
-- Ambient: the cron's hash (PREFIX), K_C, and cron_schedule's keys for the next occurrence.
local function cron_advance(id, rec, now, skipped)
  local name = cron_name_of(rec)
  if not name then return rec, nil end
  local ck = PREFIX .. 'cron:' .. name
  local c = redis.call('HMGET', ck, 'pending', 'times', 'fires', 'queue')
  if c[1] ~= id then return rec, nil end
  local times, fires = c[2] or '', c[3] or ''
  local n, i = #times / 6, 0
  while i < n and u48(fires, i * 6 + 1) <= now do i = i + 1 end
  -- the cron's missed counter: the passed table entries, and the pending one itself when it misfired
  local missed = i + (skipped and 1 or 0)
  if missed > 0 then redis.call('HINCRBY', ck, 'missed', missed) end
  if i > 0 then
    local grace = rec_opts(rec)
    if grace or skipped then
      bump(K_C, 'misfired:' .. c[4], i)
    else
      -- run late: one catch-up run stands for the latest missed occurrence and counts the others
      rec = cron_rewrite(rec, u48(times, (i - 1) * 6 + 1), i)
    end
  end
  redis.call('HSET', ck, 'last', fmt(now), 'last_fired_id', id)
  if i < n then
    cron_schedule(ck, name, u48(times, i * 6 + 1), u48(fires, i * 6 + 1), 0)
    redis.call('HSET', ck, 'times', string.sub(times, i * 6 + 7), 'fires', string.sub(fires, i * 6 + 7))
    if n - i - 1 < CRON_TABLE_LOW then return rec, name end
    return rec, nil
  end
  redis.call('HSET', ck, 'pending', '', 'times', '', 'fires', '')
  return rec, name
end
