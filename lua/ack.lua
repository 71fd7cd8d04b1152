-- ack: running -> done. Run by workers after a handler returned.
-- KEYS: the 14 partition keys (see _lib.lua), or off a Redis Cluster the timer set alone, the others
--   named from the prefix (scheduler/protocol/calls.py ONE_KEY_OFF_CLUSTER).
-- ARGV: 1-3 common; 4 tombstone ttl ms (0 = keep none); then pairs: id, token.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a
--   tombstone_ttl_ms outside 0 to 9999-12-31 in ms, no pair or half a pair, an id that is not 15
--   bytes, a token that is not an integer from 1 to 2^53 - 1.
-- Returns: one code per pair: 1 acked, 0 refused (token stale: the lease was lost and the job
-- was reaped, maybe claimed again; or the job is not running).
-- Invariants: only the holder of the current token can finish a job; a refused ack changes
-- nothing. An acked job leaves 'i', 'l', 'j', 'e', frees its idempotency key and, with ttl > 0,
-- leaves a 'done' summary in 'f' (attempts, due time of this attempt, queue, key, created, last
-- error of an earlier attempt). Expired summaries are trimmed as it goes: 4 entries of 'f' are
-- visited per job acked (sweep_after_tombstones), so trimming keeps up with any ack rate.
-- Arguments: tested inline (a worker acks every job: no call or closure for a good ack), named
-- through arg when the test failed. The two lists go together.
-- Uses: COMMON, HISTORY_TTL_S, ID_LEN, K_C, K_E, K_F, K_G, K_I, K_J, K_K, K_L, K_META, K_Q,
--       MAX_INT, MAX_MS, PREFIX, TOMB_SWEEP_EVERY, TOMB_SWEEP_MIN, TOMB_SWEEP_PER_JOB, arg, bump,
--       common_ok, flush_bumps, jget, now_ms, p48, queue_name, rec_qidx, rec_valid, refusal,
--       release_key, sweep_after_tombstones, sweep_tombstones, tally, tombstone, touch_queue, u16
-- Fast path: the ack of one job, as a worker sends it when its handler returns, whose record is
-- valid, has no idempotency key and names a queue the partition knows, with no error kept from
-- an earlier attempt. It runs before the library (see "--@library" below), so Redis does not
-- build the closures the general path needs (those of the tombstone sweep aside, which it does
-- when its turn comes: to one ack in TOMB_SWEEP_EVERY, and only once 'f' has more than
-- TOMB_SWEEP_MIN entries), and writes exactly what the general path writes, with the same reply;
-- a stale token is refused here too. Anything else falls through to the general path before any
-- write. tests/integration/test_ack_fast_path.py compares the two.
local A = ARGV
if #A == 6 and (#KEYS == 14 or #KEYS == 1) and #A[5] == ID_LEN then
  local call, string, tonumber, prefix, id, token = redis.call, string, tonumber, A[1], A[5], A[6]
  local plain = A[2] ~= prefix
  -- ARGV 1-3, KEYS[1] and the channel prefix as COMMON reads them (_lib_args.lua), then the
  -- tombstone ttl and the token as digits (their ranges below)
  local ns, p, count, ttl_s = string.match(
    prefix .. '|' .. A[3] .. '|' .. KEYS[1] .. '|' .. (plain and A[2] or '') .. '|' .. A[4],
    plain and '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|%1:|(%d+)$' or
      '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t||(%d+)$')
  local t = tonumber(token)
  if common_ok(ns, p, count, A[3]) and
      (#ttl_s < 15 or (#ttl_s == 15 and ttl_s <= '253402300799999')) and
      t and t >= 1 and t <= MAX_INT and t % 1 == 0 then
    local k_j, k_l, k_q, k_f = KEYS[3] or prefix .. 'j', KEYS[5] or prefix .. 'l', KEYS[10] or prefix .. 'q',
      KEYS[14] or prefix .. 'f'
    if call('HGET', k_l, id) ~= token then return {0} end -- refused: nothing written
    local v = call('HGET', k_j, id)
    local rec = v and string.sub(v, 7)
    local ttl = tonumber(ttl_s)
    if rec and rec_valid(rec) and string.byte(rec, 5) % 8 < 4 and
        call('HEXISTS', KEYS[7] or prefix .. 'e', id) == 0 then
      local idx = u16(rec, 1)
      local idx_s = string.format('%d', idx)
      local q = call('HGET', k_q, 'i:' .. idx_s)
      if q then
        local clock = call('TIME')
        local us = tonumber(clock[2])
        local now = tonumber(clock[1]) * 1000 + (us - us % 1000) / 1000
        local now_s = string.format('%d', now)
        call('ZREM', KEYS[4] or prefix .. 'i', id)
        call('HDEL', k_l, id)
        call('HDEL', k_j, id)
        if ttl > 0 then
          -- tombstone() of _lib_finish.lua: the record's queue, attempt and max, the due time, its
          -- creation time and an empty key
          call('HSET', k_f, id, 'd' .. p48(now) .. p48(now + ttl) .. string.sub(rec, 1, 4) .. string.sub(v, 1, 6) ..
            string.sub(rec, 6, 9) .. '\0')
          -- sweep_after_tombstones of _lib_finish.lua for one tombstone: the sweep's turn comes to
          -- one ack in TOMB_SWEEP_EVERY (the id's last byte)
          if string.byte(id, -1) % TOMB_SWEEP_EVERY == 0 and call('HLEN', k_f) > TOMB_SWEEP_MIN then
            sweep_tombstones(KEYS[13] or prefix .. 'meta', k_f, now, TOMB_SWEEP_PER_JOB * TOMB_SWEEP_EVERY)
          end
        end
        call('HINCRBY', KEYS[11] or prefix .. 'g', 'a:' .. q, '-1')
        call('HINCRBY', KEYS[12] or prefix .. 'c', 'acked:' .. q, '1')
        local hk = prefix .. 'hist:' .. string.format('%d', (now - now % 60000) / 60000) -- tally's minute
        if call('HINCRBY', hk, 'acked:' .. q, '1') == 1 then call('EXPIRE', hk, HISTORY_TTL_S) end
        call('HSET', k_q, 'u:' .. idx_s, now_s)
        return {1}
      end
    end
  end
end
-- Fast path for several jobs: the acks of one partition that waited together (zsched worker
-- --ack-linger, workers/outbox.py) or finished together, 2 to FAST_MAX of them, on the same terms
-- as one job's (above; the sweep's turn comes to a call of fewer than TOMB_SWEEP_EVERY jobs one
-- time in TOMB_SWEEP_EVERY, by the first id's last byte, and to every larger one), with no id
-- twice and no stale token. It reads the jobs' tokens, records
-- and kept errors with one command each and writes each key once for all the jobs. Anything else
-- (a stale token among them included) falls through to the general path before any write. The
-- one-job path stays apart because the tables this one builds cost a one-job ack 13 % more
-- instructions.
local FAST_MAX = 512 -- pairs: each read and write is one command of at most 2 x FAST_MAX arguments
local n = (#A - 4) / 2
if n >= 2 and n <= FAST_MAX and n % 1 == 0 and (#KEYS == 14 or #KEYS == 1) then
  local call, string, tonumber, prefix = redis.call, string, tonumber, A[1]
  local plain = A[2] ~= prefix
  -- ARGV 1-3, KEYS[1] and the channel prefix as COMMON reads them (_lib_args.lua), then the
  -- tombstone ttl as digits (its range below)
  local ns, p, count, ttl_s = string.match(
    prefix .. '|' .. A[3] .. '|' .. KEYS[1] .. '|' .. (plain and A[2] or '') .. '|' .. A[4],
    plain and '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|%1:|(%d+)$' or
      '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t||(%d+)$')
  local ok = common_ok(ns, p, count, A[3]) and (#ttl_s < 15 or (#ttl_s == 15 and ttl_s <= '253402300799999'))
  local ids, seen = {}, {}
  for b = 5, ok and #A or 0, 2 do
    local id, t = A[b], tonumber(A[b + 1])
    if not (#id == ID_LEN and t and t >= 1 and t <= MAX_INT and t % 1 == 0) or seen[id] then
      ok = false
      break
    end
    seen[id] = true
    ids[#ids + 1] = id
  end
  if ok then
    local k_j, k_l, k_q, k_f, k_e = KEYS[3] or prefix .. 'j', KEYS[5] or prefix .. 'l', KEYS[10] or prefix .. 'q',
      KEYS[14] or prefix .. 'f', KEYS[7] or prefix .. 'e'
    local toks, vals = call('HMGET', k_l, unpack(ids)), nil
    for i = 1, n do
      if toks[i] ~= A[2 * i + 4] then ok = false; break end
    end
    vals = ok and call('HMGET', k_j, unpack(ids))
    if ok and call('HLEN', k_e) > 0 then
      local errs = call('HMGET', k_e, unpack(ids))
      for i = 1, n do
        if errs[i] then ok = false; break end
      end
    end
    local names, order, per_idx = {}, {}, {}
    for i = 1, ok and n or 0 do
      local v = vals[i]
      local rec = v and string.sub(v, 7)
      if not (rec and rec_valid(rec) and string.byte(rec, 5) % 8 < 4) then ok = false; break end
      local idx = u16(rec, 1)
      local c = per_idx[idx]
      if c == nil then
        local q = call('HGET', k_q, 'i:' .. string.format('%d', idx))
        if not q then ok = false; break end
        names[idx] = q
        order[#order + 1] = idx
        c = 0
      end
      per_idx[idx] = c + 1
    end
    local ttl = tonumber(ttl_s)
    if ok then
      local clock = call('TIME')
      local us = tonumber(clock[2])
      local now = tonumber(clock[1]) * 1000 + (us - us % 1000) / 1000
      local now_s = string.format('%d', now)
      call('ZREM', KEYS[4] or prefix .. 'i', unpack(ids))
      call('HDEL', k_l, unpack(ids))
      call('HDEL', k_j, unpack(ids))
      if ttl > 0 then
        -- tombstone() of _lib_finish.lua: the record's queue, attempt and max, the due time, its
        -- creation time and an empty key
        local stamp, tombs = 'd' .. p48(now) .. p48(now + ttl), {}
        for i = 1, n do
          local v = vals[i]
          local rec = string.sub(v, 7)
          tombs[2 * i - 1] = ids[i]
          tombs[2 * i] = stamp .. string.sub(rec, 1, 4) .. string.sub(v, 1, 6) .. string.sub(rec, 6, 9) .. '\0'
        end
        call('HSET', k_f, unpack(tombs))
        -- sweep_after_tombstones of _lib_finish.lua, with this call's n tombstones
        local sweep = n * TOMB_SWEEP_PER_JOB
        if n < TOMB_SWEEP_EVERY then
          sweep = string.byte(ids[1], -1) % TOMB_SWEEP_EVERY == 0 and sweep * TOMB_SWEEP_EVERY or 0
        end
        if sweep > 0 and call('HLEN', k_f) > TOMB_SWEEP_MIN then
          sweep_tombstones(KEYS[13] or prefix .. 'meta', k_f, now, sweep)
        end
      end
      local k_g, k_c = KEYS[11] or prefix .. 'g', KEYS[12] or prefix .. 'c'
      local hk = prefix .. 'hist:' .. string.format('%d', (now - now % 60000) / 60000) -- tally's minute
      for _, idx in ipairs(order) do
        local q, c = names[idx], per_idx[idx]
        local c_s = string.format('%d', c)
        call('HINCRBY', k_g, 'a:' .. q, '-' .. c_s)
        call('HINCRBY', k_c, 'acked:' .. q, c_s)
        if call('HINCRBY', hk, 'acked:' .. q, c_s) == c then call('EXPIRE', hk, HISTORY_TTL_S) end
        call('HSET', k_q, 'u:' .. string.format('%d', idx), now_s)
      end
      local out = {}
      for i = 1, n do out[i] = 1 end
      return out
    end
  end
end
--@library
local A = ARGV
local ttl = tonumber(A[4] or '')
local good = COMMON and (#KEYS == 14 or #KEYS == 1) and ttl and ttl >= 0 and ttl <= MAX_MS and ttl % 1 == 0 and
  #A >= 6 and #A % 2 == 0
for b = 5, good and #A or 0, 2 do
  local t = tonumber(A[b + 1])
  if not (#A[b] == ID_LEN and t and t >= 1 and t <= MAX_INT and t % 1 == 0) then good = false end
end
if not good then
  if not (COMMON and (#KEYS == 14 or #KEYS == 1)) then return arg('common', 1) end
  arg('int', 4, 'tombstone_ttl_ms', 0, MAX_MS)
  arg('groups', 5, '(id, token) pairs', 2, 1)
  for b = 5, #A - 1, 2 do arg('id', b); arg('token', b + 1) end
  return refusal
end
local now = now_ms()
local out, active = {}, {}
for b = 5, #ARGV, 2 do
  local id, token = ARGV[b], ARGV[b + 1]
  if redis.call('HGET', K_L, id) ~= token then
    out[#out + 1] = 0
  else
    local rec, due = jget(K_J, id)
    redis.call('ZREM', K_I, id)
    redis.call('HDEL', K_L, id)
    redis.call('HDEL', K_J, id)
    tombstone(K_E, K_F, id, 'd', now, ttl, rec, due) -- also drops its last error
    if rec then
      release_key(K_K, id, rec)
      local q = queue_name(K_Q, rec_qidx(rec)) or '?'
      bump(K_G, 'a:' .. q, -1)
      tally(K_C, PREFIX, 'acked:' .. q, 1, now)
      active[rec_qidx(rec)] = true
    end
    out[#out + 1] = 1
  end
end
flush_bumps()
for idx in pairs(active) do touch_queue(K_Q, idx, now) end -- activity keeps a queue name from retiring
sweep_after_tombstones(K_META, K_F, now)
return out
