-- _lib_finish.lua: helpers for jobs that finish or leave the timers: tombstones, dead-letter
-- retention, queue retirement, error blobs, lease tokens, epoch fencing, cancel. The loader
-- (scheduler/protocol/scripts.py) reads _lib_args.lua, _lib.lua, this file and _lib_cron.lua as
-- one library, in that order, and prepends to each script only the definitions it uses.

-- A job finished (letter 'd' done, 'c' cancelled, 'm' misfired): its last error leaves 'e' and,
-- with ttl > 0, a summary answers get() for ttl ms. rec: its record (nil if the body is missing);
-- due: when its last attempt became due (its run_at for a job that never ran). Summary layout
-- (big-endian, 1-based offsets; decoded by scheduler/protocol/codec.py decode_tombstone):
--   1 letter | 2 finished ms (6) | 8 expires ms (6) | 14 queue index (2) | 16 attempts (1)
--   | 17 max_attempts (1) | 18 due ms of the last attempt (6) | 24 created, epoch s (4)
--   | 28 key length (1) + key | then, only if the job had one, its last error without the
--   traceback ("at_ms NUL type NUL message"), cut at TOMB_ERR_MAX bytes.
-- 28 bytes without key or error: with the 15-byte field that is three 32-byte allocations per
-- tombstone (field, value, dict entry) plus the bucket array: 106-110 bytes of Redis memory
-- measured per finished job (bench/core.py tombstone; docs/architecture.md "Tombstones").
-- k_e, k_f: the partition's errors hash and summaries hash (K_E, K_F).
local TOMB_ERR_MAX = 160
local tomb_written, tomb_pick = 0, 0 -- this call's tombstones (per-call accumulators: see _lib.lua)
local function tombstone(k_e, k_f, id, letter, now, ttl, rec, due)
  local err = redis.call('HGET', k_e, id)
  if err then redis.call('HDEL', k_e, id) end
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
  redis.call('HSET', k_f, id, v)
  tomb_written = tomb_written + 1
  if tomb_written == 1 then tomb_pick = string.byte(id, -1) or 0 end
end
-- Trim expired summaries of k_f (K_F): an incremental HSCAN whose cursor is kept in k_meta's 'fcur' visits about
-- 'count' entries from where the previous call stopped and deletes the expired ones, so every
-- entry is visited once per sweep of the whole hash whatever the finish rate. Returns
-- (entries visited, entries deleted). (A hash small enough for the listpack encoding is returned
-- whole: at most hash-max-listpack-entries, 128 by default.)
local function sweep_tombstones(k_meta, k_f, now, count)
  local stored = redis.call('HGET', k_meta, 'fcur') or '0'
  local start, cur, visited, deleted = stored, stored, 0, 0
  local byte = string.byte
  for _ = 1, 2 do -- from the stored cursor; once more from the start if the hash ended first
    local r = redis.call('HSCAN', k_f, cur, 'COUNT', fmt(count - visited))
    local kv, del = r[2], {}
    for i = 2, #kv, 2 do
      local a, b, c, d, e, f = byte(kv[i], 8, 13) -- expires ms, inlined: this loop is the sweep's cost
      if not f or ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f <= now then del[#del + 1] = kv[i - 1] end
    end
    if #del > 0 then multi('HDEL', k_f, del) end
    visited, deleted, cur = visited + #kv / 2, deleted + #del, r[1]
    if cur ~= '0' or start == '0' or visited >= count then break end
    start = '0'
  end
  if cur ~= stored then redis.call('HSET', k_meta, 'fcur', cur) end
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
local function sweep_after_tombstones(k_meta, k_f, now)
  if tomb_written == 0 then return end
  local count = tomb_written * TOMB_SWEEP_PER_JOB
  if tomb_written < TOMB_SWEEP_EVERY then
    if tomb_pick % TOMB_SWEEP_EVERY ~= 0 then return end
    count = count * TOMB_SWEEP_EVERY
  end
  if redis.call('HLEN', k_f) > TOMB_SWEEP_MIN then sweep_tombstones(k_meta, k_f, now, count) end
end
-- Free the idempotency key of a job that leaves the live states (k_k: K_K), if it still names it.
local function release_key(k_k, id, rec)
  local _, _, key = rec_opts(rec)
  if key and redis.call('HGET', k_k, key) == id then redis.call('HDEL', k_k, key) end
end

-- Dead-letter retention (run by tick): drop dead jobs older than dead_ttl ms and, past max_dead
-- per partition, the oldest; at most 'limit' per call (bounded work). Returns the dropped ids and
-- their queues as a flat list, for the caller's log line per job.
-- Ambient: a dropped job leaves every trace (K_D, K_J, K_E, K_K, its name in K_Q, K_G, K_C).
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
    local rec = jget(K_J, id)
    redis.call('HDEL', K_J, id)
    redis.call('HDEL', K_E, id)
    local q = rec and queue_name(K_Q, rec_qidx(rec)) or '?'
    if rec then release_key(K_K, id, rec) end
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
-- Ambient: a retired name leaves every trace (K_Q, K_G, K_C, PREFIX's lists and "qfree", K_META's cursor).
local function retire_queues(now, idle_ms, count)
  if idle_ms <= 0 then return 0 end
  local res = redis.call('HSCAN', K_Q, redis.call('HGET', K_META, 'qcur') or '0', 'MATCH', 'n:*', 'COUNT', count)
  redis.call('HSET', K_META, 'qcur', res[1])
  local n, f = 0, res[2]
  for i = 1, #f, 2 do
    local name, idx = string.sub(f[i], 3), f[i + 1]
    local used = redis.call('HGET', K_Q, 'u:' .. idx)
    if not used then
      touch_queue(K_Q, idx, now) -- a name from before retirement existed: start its clock now
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
-- Returns the first of n consecutive tokens (~1.7e15: exact in a Lua double, below 2^53). 'us': the
-- server clock in microseconds, from the caller's TIME (one TIME less per claim). The counter is
-- k_meta's (K_META) 'fence'.
local function next_tokens(k_meta, n, us)
  local cur = tonumber(redis.call('HGET', k_meta, 'fence') or '0')
  local base = math.max(cur, us)
  redis.call('HSET', k_meta, 'fence', fmt(base + n))
  return base + 1
end

-- Fencing for the scheduler tier: refuse an epoch older than the newest one seen (k_meta's
-- 'epoch': K_META). 0 = unfenced.
local function check_epoch(k_meta, epoch)
  if epoch <= 0 then return nil end
  local cur = tonumber(redis.call('HGET', k_meta, 'epoch') or '0')
  if epoch < cur then return cur end
  if epoch > cur then redis.call('HSET', k_meta, 'epoch', fmt(epoch)) end
  return nil
end

-- Tick's share of tombstone trimming (bounded work): sweep TICK_SWEEP summaries (at most the
-- batch limit; + TOMB_SWEEP_PER_JOB per tombstone this tick wrote), and remove at most 'limit'
-- expired entries of the legacy 'x' zset k_x (tombstones written before summaries existed) so an
-- upgraded partition drains it. The writers do most of the sweeping; the ticks' share is a safety
-- net (about 0.3 ms per tick) and the drain once jobs stop finishing: returns true when more
-- expired tombstones are likely left (half the sweep or more was expired, or the legacy set has
-- more), and the caller ticks again at once.
local TICK_SWEEP = 256
local function trim_tombstones(k_meta, k_f, k_x, now, limit)
  local count = math.min(limit, TICK_SWEEP) + tomb_written * TOMB_SWEEP_PER_JOB
  local _, deleted = sweep_tombstones(k_meta, k_f, now, count)
  local more = deleted * 2 >= count
  local n = redis.call('ZCOUNT', k_x, '-inf', fmt(now))
  if n > 0 then
    redis.call('ZREMRANGEBYRANK', k_x, 0, math.min(n, limit) - 1)
    if n > limit then more = true end
  end
  return more
end

-- Cancel a scheduled (timer or held) or ready job. Returns 1 cancelled, 0 no live job, -1 running,
-- -2 dead. Used by cancel, and by the cron scripts to drop a cron's pending occurrence.
-- Ambient: it finds the job in any state and removes every trace of it: K_T, K_M, K_J, K_I, K_D,
-- PREFIX's held set or ready list, K_K, K_E, K_F, K_Q, K_G, K_C.
local function cancel_job(id, now, ttl)
  local member, due = find_timer(K_T, K_M, id)
  local rec
  if member then
    rec = string.sub(member, ID_LEN + 1)
    remove_timer(K_T, K_M, id, member)
    bump(K_G, 's:' .. (queue_name(K_Q, rec_qidx(rec)) or '?'), -1)
  else
    rec, due = jget(K_J, id)
    if not rec then return 0 end
    if redis.call('ZSCORE', K_I, id) then return -1 end
    if redis.call('ZSCORE', K_D, id) then return -2 end
    if not unlink_waiting(PREFIX, K_G, id, queue_name(K_Q, rec_qidx(rec)) or '?') then
      error('zsched: job body without a state (invariant broken) in cancel')
    end
    redis.call('HDEL', K_J, id)
  end
  release_key(K_K, id, rec)
  tombstone(K_E, K_F, id, 'c', now, ttl, rec, due) -- also drops its last error
  bump(K_C, 'cancelled:' .. (queue_name(K_Q, rec_qidx(rec)) or '?'))
  return 1
end