-- _lib.lua: helpers shared by every script. The loader (scheduler/scripts.py) prepends the
-- definitions a script uses (transitively) to it, so each script is one self-contained EVALSHA.
--
-- Common calling convention of partition scripts:
--   KEYS[1..14] = the partition's keys, in scheduler/keys.py PARTITION_KEYS order:
--     t (timers zset), m (moved hash), j (bodies hash: due(6) .. record), i (in-flight zset), l (lease tokens hash),
--     d (dead zset), e (errors hash), k (idempotency keys hash), x (legacy tombstones zset, drained by tick),
--     q (queue names hash), g (gauges hash), c (counters hash), meta (fence, epoch, fcur),
--     f (finished jobs: tombstone summaries hash, see tombstone() below)
--   ARGV[1] = partition key prefix "{ns:p}:"  (ready lists are PREFIX .. "r:" .. queue, same slot)
--   ARGV[2] = channel prefix "ns:"            (wake: CHAN.."wake", ready: CHAN.."ready:"..queue)
--   ARGV[3] = partition number (the pub/sub message)
--   ARGV[4..] script-specific, see each script's header.
-- Times are Redis server milliseconds (TIME). Jitter is always computed by the caller: Redis's
-- Lua random generator is deterministic.
local K_T, K_M, K_J, K_I, K_L, K_D, K_E, K_K, K_X, K_Q, K_G, K_C, K_META, K_F =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
  KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local PREFIX, CHAN, PART = ARGV[1], ARGV[2], ARGV[3]
local ID_LEN = 15
local CHUNK = 2000 -- arguments per variadic call, well under Lua's unpack limit

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- integers as decimal strings: tostring() would switch to exponent notation past 14 digits
local function fmt(n) return string.format('%d', n) end
local function u16(s, i) local a, b = string.byte(s, i, i + 1); return a * 256 + b end
local function u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end
local function u48(s, i) return u16(s, i) * 4294967296 + u32(s, i + 2) end
local function p16(n) return string.char(math.floor(n / 256), n % 256) end
local function p32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
end
local function p48(n) return p16(math.floor(n / 4294967296)) .. p32(n % 4294967296) end
local function flag(flags, bitv) return math.floor(flags / bitv) % 2 == 1 end

-- Record accessors; layout in scheduler/codec.py (1-based offsets here).
-- 0 (no queue has index 0) for a body too short to hold one, so lookups fail cleanly
local function rec_qidx(rec) if #rec < 9 then return 0 end return u16(rec, 1) end
local function rec_attempt(rec) return string.byte(rec, 3) end
local function rec_max(rec) return string.byte(rec, 4) end
-- misfire grace ms (nil for run_late), lease ms, idempotency key (or nil)
local function rec_opts(rec)
  local flags = string.byte(rec, 5)
  local pos, grace, lease, key = 10, nil, 30000, nil
  if flag(flags, 1) then grace = u32(rec, pos); pos = pos + 4 end
  if flag(flags, 8) then lease = u32(rec, pos); pos = pos + 4 end
  if flag(flags, 4) then
    local n = string.byte(rec, pos)
    key = string.sub(rec, pos + 1, pos + n)
  end
  return grace, lease, key
end
-- A record is well-formed when its header and every optional section its flags announce fit.
-- Only direct writes or bugs produce bad ones; the entry points (tick, claim) dead-letter them
-- instead of failing halfway, since Redis does not roll a script back on error.
local function rec_valid(rec)
  if type(rec) ~= 'string' or #rec < 9 then return false end
  local flags = string.byte(rec, 5)
  local pos = 10
  if flag(flags, 1) then pos = pos + 4 end
  if flag(flags, 8) then pos = pos + 4 end
  if flag(flags, 4) then
    if #rec < pos then return false end
    pos = pos + 1 + string.byte(rec, pos)
  end
  if flag(flags, 16) then pos = pos + 8 end
  return #rec >= pos - 1
end
local function rec_with_attempt(rec, a)
  return string.sub(rec, 1, 2) .. string.char(a) .. string.sub(rec, 4)
end

-- 'j' values are: due ms (6 bytes, when the job became due: fire time of this attempt) .. record
local function jval(rec, due) return p48(due) .. rec end
local function jget(id)
  local v = redis.call('HGET', K_J, id)
  if not v then return nil end
  return string.sub(v, 7), u48(v, 1)
end

-- Byte-wise id comparison: Lua's '<' on strings uses strcoll, which is locale dependent.
local function id_less(a, b)
  for n = 1, ID_LEN do
    local x, y = string.byte(a, n), string.byte(b, n)
    if x ~= y then return x < y end
  end
  return false
end

local qname_cache = {}
local function queue_name(idx)
  local name = qname_cache[idx]
  if name == nil then
    name = redis.call('HGET', K_Q, 'i:' .. idx)
    qname_cache[idx] = name
  end
  return name -- false when the index is unknown (corrupt record)
end
-- Queue names are interned per partition (a 2-byte index in every record): 'n:NAME' -> idx,
-- 'i:IDX' -> name, 'u:IDX' -> last activity ms (a job scheduled or finished). A queue that is
-- empty and idle for the retirement time loses its name entries (retire_queues, run by tick);
-- its index cools for as long again in PREFIX.."qfree" (score = reusable from) so no record,
-- summary or counter can still mean the old name, and is reused only once the 65535 fresh
-- indexes are spent.
local function queue_index(name)
  local idx = redis.call('HGET', K_Q, 'n:' .. name)
  if idx then return tonumber(idx) end
  idx = redis.call('HINCRBY', K_Q, 'next', 1)
  if idx > 65535 then
    redis.call('HSET', K_Q, 'next', 65535)
    local t = redis.call('TIME')
    local cooled = redis.call('ZRANGE', PREFIX .. 'qfree', '-inf', t[1] .. '000', 'BYSCORE', 'LIMIT', 0, 1)
    if #cooled == 0 then
      error('zsched: 65535 queue names are in use in this partition and none is retired yet; queues are ' ..
            'retired after being empty and idle for the queue retirement time (Client.set_queue_retirement)')
    end
    redis.call('ZREM', PREFIX .. 'qfree', cooled[1])
    idx = tonumber(cooled[1])
  end
  redis.call('HSET', K_Q, 'n:' .. name, idx, 'i:' .. idx, name)
  return idx
end
local function touch_queue(idx, now) redis.call('HSET', K_Q, 'u:' .. idx, fmt(now)) end

-- Counter and gauge increments are summed in Lua and written once per field per call.
local bumps = {}
local function bump(key, field, n)
  local h = bumps[key]
  if not h then h = {}; bumps[key] = h end
  h[field] = (h[field] or 0) + (n or 1)
end
local function flush_bumps()
  for key, h in pairs(bumps) do
    for field, n in pairs(h) do
      if n ~= 0 then redis.call('HINCRBY', key, field, n) end
    end
  end
end

-- Variadic command in chunks: cmd(key, prefix_args..., items...).
local function multi(cmd, key, items)
  for s = 1, #items, CHUNK do
    redis.call(cmd, key, unpack(items, s, math.min(s + CHUNK - 1, #items)))
  end
end

local function head_score()
  local h = redis.call('ZRANGE', K_T, 0, 0, 'WITHSCORES')
  if h[2] then return tonumber(h[2]) end
  return nil
end

-- Find a scheduled job in the timer set without a per-job index: its score is the id's run_at
-- unless the job moved (then 'm' has it); among equal scores members sort by id bytes, so a
-- binary search by rank finds it in O(log n).
local function find_timer(id)
  if string.len(id) ~= ID_LEN then return nil end
  local s = redis.call('HGET', K_M, id)
  if s then s = tonumber(s) else s = u48(id, 1) end
  local ss = fmt(s)
  local n = redis.call('ZCOUNT', K_T, ss, ss)
  if n == 0 then return nil end
  local lo = redis.call('ZCOUNT', K_T, '-inf', '(' .. ss)
  local hi = lo + n - 1
  if n <= 8 then
    for _, m in ipairs(redis.call('ZRANGE', K_T, lo, hi)) do
      if string.sub(m, 1, ID_LEN) == id then return m, s end
    end
    return nil
  end
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', K_T, mid, mid)[1]
    local mid_id = string.sub(m, 1, ID_LEN)
    if mid_id == id then return m, s end
    if id_less(mid_id, id) then lo = mid + 1 else hi = mid - 1 end
  end
  return nil
end

-- Does a job with this id exist in any state, or as a tombstone? (re-sent schedule calls)
local function job_exists(id)
  if redis.call('HEXISTS', K_J, id) == 1 or redis.call('HEXISTS', K_F, id) == 1 or find_timer(id) then
    return true
  end
  if redis.call('EXISTS', K_X) == 1 then -- legacy tombstones, until tick has drained them
    for _, letter in ipairs({'d', 'c', 'm'}) do
      if redis.call('ZSCORE', K_X, id .. letter) then return true end
    end
  end
  return false
end

-- Remove a job that has a body in 'j' and is neither running nor dead: it is either in its ready
-- list or held back by its queue's rate limit ('h:QUEUE'). Returns false if it is in neither.
local function unlink_waiting(id, q)
  if redis.call('ZREM', PREFIX .. 'h:' .. q, id) == 1 then
    bump(K_G, 's:' .. q, -1)
    bump(K_G, 'h:' .. q, -1)
    return true
  end
  return redis.call('LREM', PREFIX .. 'r:' .. q, 1, id) == 1
end

local function remove_timer(id, member)
  redis.call('ZREM', K_T, member)
  redis.call('HDEL', K_M, id)
end

-- Add to the timer set; remember the score in 'm' when it differs from the id's own run_at.
local function put_timer(id, rec, at)
  redis.call('ZADD', K_T, at, id .. rec)
  if at ~= u48(id, 1) then redis.call('HSET', K_M, id, fmt(at)) else redis.call('HDEL', K_M, id) end
end

local ready_touched = {}
local function push_ready(id, qname, front)
  if front then
    redis.call('RPUSH', PREFIX .. 'r:' .. qname, id) -- the tail is popped next
  else
    redis.call('LPUSH', PREFIX .. 'r:' .. qname, id)
  end
  ready_touched[qname] = true
end
local function publish_ready()
  for qname in pairs(ready_touched) do redis.call('PUBLISH', CHAN .. 'ready:' .. qname, PART) end
end
-- Put a job back to work at 'at': its ready list when due (body in 'j', due = at), else the timer
-- set (body inside the timer member). Returns 'at' when it went to the timer set, so the caller
-- can wake the partition's owner if it lands before the earliest timer; nil otherwise.
local function place(id, rec, q, at, now)
  if at <= now then
    redis.call('HSET', K_J, id, jval(rec, at))
    push_ready(id, q, false)
    return nil
  end
  redis.call('HDEL', K_J, id)
  put_timer(id, rec, at)
  bump(K_G, 's:' .. q)
  return at
end
local function wake_scheduler() redis.call('PUBLISH', CHAN .. 'wake', PART) end

-- A job finished (letter 'd' done, 'c' cancelled, 'm' misfired): its last error leaves 'e' and,
-- with ttl > 0, a summary answers get() for ttl ms. rec: its record (nil if the body is missing);
-- due: when its last attempt became due (its run_at for a job that never ran). Summary layout
-- (big-endian, 1-based offsets; decoded by scheduler/codec.py decode_tombstone):
--   1 letter | 2 finished ms (6) | 8 expires ms (6) | 14 queue index (2) | 16 attempts (1)
--   | 17 max_attempts (1) | 18 due ms of the last attempt (6) | 24 created, epoch s (4)
--   | 28 key length (1) + key | then, only if the job had one, its last error without the
--   traceback ("at_ms NUL type NUL message"), cut at TOMB_ERR_MAX bytes.
-- 28 bytes without key or error: with the 15-byte field that is three 32-byte allocations per
-- tombstone (field, value, dict entry) plus the bucket array: 106-110 bytes of Redis memory
-- measured per finished job (bench/core.py tombstone; docs/architecture.md "Tombstones").
local TOMB_ERR_MAX = 160
local tomb_written, tomb_pick = 0, 0
local function tombstone(id, letter, now, ttl, rec, due)
  local err = redis.call('HGET', K_E, id)
  if err then redis.call('HDEL', K_E, id) end
  if ttl <= 0 then return end
  local qidx, a, mx, created, key = 0, 0, 0, 0, nil
  if rec and #rec >= 9 then
    qidx, a, mx, created = u16(rec, 1), string.byte(rec, 3), string.byte(rec, 4), u32(rec, 6)
    if rec_valid(rec) then
      local _
      _, _, key = rec_opts(rec)
    end
  end
  key = key or ''
  local v = letter .. p48(now) .. p48(now + ttl) .. p16(qidx) .. string.char(a, mx) .. p48(due or 0) ..
    p32(created) .. string.char(#key) .. key
  if err then
    local n1 = string.find(err, '\0', 1, true)
    local n2 = n1 and string.find(err, '\0', n1 + 1, true)
    local n3 = n2 and string.find(err, '\0', n2 + 1, true)
    if n3 then err = string.sub(err, 1, n3 - 1) end
    v = v .. string.sub(err, 1, TOMB_ERR_MAX)
  end
  redis.call('HSET', K_F, id, v)
  tomb_written = tomb_written + 1
  if tomb_written == 1 then tomb_pick = string.byte(id, -1) or 0 end
end
-- Trim expired summaries: an incremental HSCAN whose cursor is kept in meta 'fcur' visits about
-- 'count' entries from where the previous call stopped and deletes the expired ones, so every
-- entry is visited once per sweep of the whole hash whatever the finish rate. Returns
-- (entries visited, entries deleted). (A hash small enough for the listpack encoding is returned
-- whole: at most hash-max-listpack-entries, 128 by default.)
local function sweep_tombstones(now, count)
  local stored = redis.call('HGET', K_META, 'fcur') or '0'
  local start, cur, visited, deleted = stored, stored, 0, 0
  local byte = string.byte
  for _ = 1, 2 do -- from the stored cursor; once more from the start if the hash ended first
    local r = redis.call('HSCAN', K_F, cur, 'COUNT', count - visited)
    local kv, del = r[2], {}
    for i = 2, #kv, 2 do
      local a, b, c, d, e, f = byte(kv[i], 8, 13) -- expires ms, inlined: this loop is the sweep's cost
      if not f or ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f <= now then del[#del + 1] = kv[i - 1] end
    end
    if #del > 0 then multi('HDEL', K_F, del) end
    visited, deleted, cur = visited + #kv / 2, deleted + #del, r[1]
    if cur ~= '0' or start == '0' or visited >= count then break end
    start = '0'
  end
  if cur ~= stored then redis.call('HSET', K_META, 'fcur', cur) end
  return visited, deleted
end
-- Called at the end of every script that writes tombstones at its callers' rate (ack, cancel,
-- schedule): visits TOMB_SWEEP_PER_JOB entries per tombstone written on average, so the sweep
-- goes round the hash faster than it grows: an entry is deleted at most one sweep after it
-- expired, and the hash stays below rate x ttl x 1/(1 - 1/TOMB_SWEEP_PER_JOB) = 1.5 x (measured at
-- 5 000 acks/s, 1 s ttl: 1.25 x).
-- A call that wrote fewer than TOMB_SWEEP_EVERY tombstones sweeps only one time in
-- TOMB_SWEEP_EVERY, TOMB_SWEEP_EVERY times as much, so a one-job ack pays the sweep's four
-- commands one time in eight; the pick is the last byte of the first finished id (random bits:
-- Redis's Lua random generator is deterministic). Below TOMB_SWEEP_MIN entries the owner's ticks
-- (one per second at least, each sweeping TICK_SWEEP entries) keep up on their own.
local TOMB_SWEEP_PER_JOB, TOMB_SWEEP_EVERY, TOMB_SWEEP_MIN = 3, 8, 512
local function sweep_after_tombstones(now)
  if tomb_written == 0 then return end
  local count = tomb_written * TOMB_SWEEP_PER_JOB
  if tomb_written < TOMB_SWEEP_EVERY then
    if tomb_pick % TOMB_SWEEP_EVERY ~= 0 then return end
    count = count * TOMB_SWEEP_EVERY
  end
  if redis.call('HLEN', K_F) > TOMB_SWEEP_MIN then sweep_tombstones(now, count) end
end
local function release_key(id, rec)
  local _, _, key = rec_opts(rec)
  if key and redis.call('HGET', K_K, key) == id then redis.call('HDEL', K_K, key) end
end

-- Dead-letter retention (run by tick): drop dead jobs older than dead_ttl ms and, past max_dead
-- per partition, the oldest; at most 'limit' per call (bounded work). Returns the dropped ids and
-- their queues as a flat list, for the caller's log line per job.
local function trim_dead(now, dead_ttl, max_dead, limit)
  local victims, seen = {}, {}
  if dead_ttl > 0 then
    for _, id in ipairs(redis.call('ZRANGE', K_D, '-inf', fmt(now - dead_ttl), 'BYSCORE', 'LIMIT', 0, limit)) do
      victims[#victims + 1] = id; seen[id] = true
    end
  end
  if max_dead > 0 and #victims < limit then
    local over = redis.call('ZCARD', K_D) - #victims - max_dead
    if over > 0 then
      for _, id in ipairs(redis.call('ZRANGE', K_D, 0, math.min(over, limit - #victims) + #victims - 1)) do
        if not seen[id] then victims[#victims + 1] = id end
      end
    end
  end
  local out = {}
  for _, id in ipairs(victims) do
    redis.call('ZREM', K_D, id)
    local rec = jget(id)
    redis.call('HDEL', K_J, id)
    redis.call('HDEL', K_E, id)
    local q = rec and queue_name(rec_qidx(rec)) or '?'
    if rec then release_key(id, rec) end
    bump(K_G, 'd:' .. q, -1)
    bump(K_C, 'dropped:' .. q)
    out[#out + 1] = id; out[#out + 1] = q
  end
  return out
end

-- Queue retirement (run by tick): visit a few interned names per call (an HSCAN cursor in meta
-- 'qcur'); retire a name whose queue holds nothing in this partition (no scheduled, held, ready,
-- running or dead job) and saw no activity for idle_ms. Its gauges and counters go with it.
local QUEUE_EVENTS = {'scheduled', 'fired', 'acked', 'failed', 'retried', 'dead', 'misfired', 'cancelled',
  'expired', 'requeued', 'purged', 'released', 'rescheduled', 'ratelimited', 'dropped'}
local function retire_queues(now, idle_ms, count)
  if idle_ms <= 0 then return 0 end
  local res = redis.call('HSCAN', K_Q, redis.call('HGET', K_META, 'qcur') or '0', 'MATCH', 'n:*', 'COUNT', count)
  redis.call('HSET', K_META, 'qcur', res[1])
  local n, f = 0, res[2]
  for i = 1, #f, 2 do
    local name, idx = string.sub(f[i], 3), f[i + 1]
    local used = redis.call('HGET', K_Q, 'u:' .. idx)
    if not used then
      touch_queue(idx, now) -- a name from before retirement existed: start its clock now
    elseif now - tonumber(used) >= idle_ms then
      local g = redis.call('HMGET', K_G, 's:' .. name, 'a:' .. name, 'd:' .. name, 'h:' .. name)
      local busy = redis.call('LLEN', PREFIX .. 'r:' .. name) > 0 or redis.call('EXISTS', PREFIX .. 'h:' .. name) == 1
      for j = 1, 4 do busy = busy or (tonumber(g[j] or '0') ~= 0) end
      if not busy then
        redis.call('HDEL', K_Q, 'n:' .. name, 'i:' .. idx, 'u:' .. idx)
        redis.call('HDEL', K_G, 's:' .. name, 'a:' .. name, 'd:' .. name, 'h:' .. name)
        local fields = {}
        for _, ev in ipairs(QUEUE_EVENTS) do fields[#fields + 1] = ev .. ':' .. name end
        redis.call('HDEL', K_C, unpack(fields))
        redis.call('ZADD', PREFIX .. 'qfree', now + idle_ms, idx)
        qname_cache[tonumber(idx)] = nil
        n = n + 1
      end
    end
  end
  return n
end

-- Errors are stored as: at_ms NUL type NUL message NUL traceback (simple to build here and in Python).
local function error_blob(now, etype, msg) return fmt(now) .. '\0' .. etype .. '\0' .. msg .. '\0' end

-- Lease tokens (fences) never go backwards, even when Redis loses its latest writes (AOF
-- everysec after a crash, failover to an asynchronous replica): the next token is above both the
-- stored counter and the server clock in microseconds, so a counter rolled back by a few writes
-- still hands out tokens larger than any it handed out before the loss (the clock has moved on).
-- Returns the first of n consecutive tokens (~1.7e15: exact in a Lua double, below 2^53).
local function next_tokens(n)
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local cur = tonumber(redis.call('HGET', K_META, 'fence') or '0')
  local base = math.max(cur, us)
  redis.call('HSET', K_META, 'fence', fmt(base + n))
  return base + 1
end

-- Fencing for the scheduler tier: refuse an epoch older than the newest one seen. 0 = unfenced.
local function check_epoch(epoch)
  if epoch <= 0 then return nil end
  local cur = tonumber(redis.call('HGET', K_META, 'epoch') or '0')
  if epoch < cur then return cur end
  if epoch > cur then redis.call('HSET', K_META, 'epoch', fmt(epoch)) end
  return nil
end

-- Tick's share of tombstone trimming (bounded work): sweep TICK_SWEEP summaries (at most the
-- batch limit; + TOMB_SWEEP_PER_JOB per tombstone this tick wrote), and remove at most 'limit'
-- expired entries of the legacy 'x' zset (tombstones written before summaries existed) so an
-- upgraded partition drains it. The writers do most of the sweeping; the ticks' share is a safety
-- net (about 0.3 ms per tick) and the drain once jobs stop finishing: returns true when more
-- expired tombstones are likely left (half the sweep or more was expired, or the legacy set has
-- more), and the caller ticks again at once.
local TICK_SWEEP = 256
local function trim_tombstones(now, limit)
  local count = math.min(limit, TICK_SWEEP) + tomb_written * TOMB_SWEEP_PER_JOB
  local _, deleted = sweep_tombstones(now, count)
  local more = deleted * 2 >= count
  local n = redis.call('ZCOUNT', K_X, '-inf', fmt(now))
  if n > 0 then
    redis.call('ZREMRANGEBYRANK', K_X, 0, math.min(n, limit) - 1)
    if n > limit then more = true end
  end
  return more
end

-- Cancel a scheduled (timer or held) or ready job. Returns 1 cancelled, 0 no live job, -1 running,
-- -2 dead. Used by cancel, and by the cron scripts to drop a cron's pending occurrence.
local function cancel_job(id, now, ttl)
  local member, due = find_timer(id)
  local rec
  if member then
    rec = string.sub(member, ID_LEN + 1)
    remove_timer(id, member)
    bump(K_G, 's:' .. (queue_name(rec_qidx(rec)) or '?'), -1)
  else
    rec, due = jget(id)
    if not rec then return 0 end
    if redis.call('ZSCORE', K_I, id) then return -1 end
    if redis.call('ZSCORE', K_D, id) then return -2 end
    if not unlink_waiting(id, queue_name(rec_qidx(rec)) or '?') then
      error('zsched: job body without a state (invariant broken) in cancel')
    end
    redis.call('HDEL', K_J, id)
  end
  release_key(id, rec)
  tombstone(id, 'c', now, ttl, rec, due) -- also drops its last error
  bump(K_C, 'cancelled:' .. (queue_name(rec_qidx(rec)) or '?'))
  return 1
end

-- Cron: definitions live in PREFIX.."cron:"..NAME (fields: def, head, tail, queue, times, fires,
-- pending, last, last_at, ver); PREFIX.."crons" is the set of names. 'times'/'fires' hold the
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
local function cron_schedule(ck, name, nominal, fire, missed)
  local c = redis.call('HMGET', ck, 'head', 'tail', 'queue')
  local key = 'cron:' .. name .. ':' .. fmt(nominal)
  local existing = redis.call('HGET', K_K, key)
  if existing then
    -- adopt it only if it really is this cron's occurrence (e.g. created by a tick that died
    -- before recording it); anything else holding the key loses it
    local member = find_timer(existing)
    local erec = member and string.sub(member, ID_LEN + 1) or jget(existing)
    if erec and rec_is_cron(erec) and cron_name_of(erec) == name then
      redis.call('HSET', ck, 'pending', existing, 'pnom', fmt(nominal))
      return existing
    end
  end
  local seq = redis.call('HINCRBY', K_META, 'cronseq', 1)
  -- Lua-made ids: top bit of the random part set, so they never collide with client-made ids
  local id = p48(fire) .. p16(tonumber(PART)) .. string.char(128) .. p48(seq)
  local head = c[1]
  local rec = p16(queue_index(c[3])) .. string.sub(head, 3, 4) .. string.char(string.byte(head, 5) + 4 + 16) ..
    string.sub(head, 6) .. string.char(#key) .. key .. p48(nominal) .. p16(missed) .. c[2]
  redis.call('HSET', K_K, key, id)
  local h = head_score()
  redis.call('ZADD', K_T, fire, id .. rec)
  if h == nil or fire < h then wake_scheduler() end
  bump(K_G, 's:' .. c[3])
  bump(K_C, 'scheduled:' .. c[3])
  redis.call('HSET', ck, 'pending', id, 'pnom', fmt(nominal))
  return id
end
-- The pending occurrence 'id' fired (or misfired) at 'now': schedule the next future occurrence
-- from the table. Returns the record to fire (run_late: nominal/missed updated when occurrences
-- were missed and are coalesced into this run) and whether the runner must refill the table.
local function cron_advance(id, rec, now, skipped)
  local name = cron_name_of(rec)
  if not name then return rec, nil end
  local ck = PREFIX .. 'cron:' .. name
  local c = redis.call('HMGET', ck, 'pending', 'times', 'fires', 'queue')
  if c[1] ~= id then return rec, nil end
  local times, fires = c[2] or '', c[3] or ''
  local n, i = #times / 6, 0
  while i < n and u48(fires, i * 6 + 1) <= now do i = i + 1 end
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
