-- tick: fire due timers. Run only by the partition's owner (scheduler tier).
-- KEYS: the 14 partition keys (see _lib.lua), or off a Redis Cluster the timer set alone, the others
--   named from the prefix (scheduler/protocol/calls.py ONE_KEY_OFF_CLUSTER).
-- ARGV: 1-3 common; 4 epoch (ownership fencing; 0 = unfenced); 5 batch limit; 6 tombstone ttl ms;
--       7 number n of rate-limited queues (optional, default 0); then n pairs: queue name, tokens granted for this tick;
--       then (optional) dead-letter retention: dead ttl ms (0 = keep), max dead jobs in this
--       partition (0 = no cap); then (optional) queue retirement: idle ms (0 = never retire names);
--       then (optional) hand-off lead ms (default 0): timers due up to this long from now fire
--       now, so a worker has them in hand at their due time and starts them on its own timer,
--       never before due (workers/runner.py). Jobs handed off early keep their due time;
--       then (optional) housekeeping, 0 or 1 (default 1): 1 also looks for held jobs of queues
--       that are no longer rate-limited (a scan of the gauges, O(queues)); the tier sends 1 on
--       about one tick per second per partition, with the retention arguments, and 0 otherwise.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, an
--   epoch outside 0 to 2^53 - 1, a batch outside 1-5000 (the tier's --batch), a tombstone_ttl_ms,
--   dead_ttl_ms, queue_idle_ms or handoff_lead_ms outside 0 to 9999-12-31 in ms, a
--   rate_limited_queues count or max_dead outside 0 to 2^53 - 1, a housekeeping other than 0 or 1,
--   a count of arguments that does not fit (7 + 2 x rate_limited_queues, then up to 5 optional
--   ones), a rate-limited queue that is
--   not a queue name or comes twice, tokens outside 0 to 2^53 - 1. Tested inline, with the numbers
--   the script uses; arg names the culprit when that test fails.
-- Returns: {-1, newest_epoch} when the epoch is refused; else
--          {moved, next_due_ms or -1, now_ms, n, (queue, tokens_used, held_now, newly_held) * n,
--           c, cron names * c, k, (dropped dead id, its queue) * k, r, (queue, burst) * r, burst_due_ms or -1,
--           lateness_ms...}:
--          the crons whose table of upcoming occurrences runs low (or ran out) and must be refilled
--          by the caller (cron_fill); the dead jobs dropped by the retention rule (for the caller's
--          log); on Redis Cluster (sharded CHAN) the queues whose ready lists received jobs (and
--          are not paused in this partition), whose bells the caller rings (they are in another
--          slot; r = 0 off a cluster, where the script rang them), each with 1 when it received
--          a burst (BURST_RING jobs or more due within BURST_SPAN_MS: bursty in _lib.lua; the caller
--          rings the burst bell) else 0; then the due time of the
--          BURST_RING-th earliest remaining timer (-1: fewer remain), with which the caller sees a
--          burst coming (burst_score in _lib.lua); then one lateness value per fired job (now - its
--          due time; negative when handed off ahead of time).
-- Cron occurrences: when one fires (or misfires), the cron's next occurrence is scheduled in this
-- same script, so a cron always has exactly one pending occurrence. Occurrences missed during an
-- outage are coalesced into one catch-up run (run_late) or counted as misfired (skip).
-- Invariants: each due member leaves 't' and enters exactly one of: 'j' + its queue's ready list
-- (fired), 'j' + the queue's held set 'h:QUEUE' (rate-limited: still "scheduled", due but waiting
-- for a token), a 'misfired' tombstone (skip policy, grace passed), or 'd' (record names an
-- unknown queue). Held jobs are released oldest first, one token each; a queue that is no longer
-- limited but still has held jobs (gauge 'h:QUEUE' > 0) is released without a token limit. Work is bounded by the
-- batch limit plus the tokens granted; the caller loops while a full batch came back.
-- Tombstones: a tick sweeps 256 of the finished-job summaries 'f' (incremental HSCAN,
-- cursor in meta 'fcur') deleting expired ones, and drains expired entries of the legacy 'x'
-- zset; when that found a dense run of expired tombstones, 'moved' is reported as the batch limit
-- so the caller ticks again at once (a partition that stopped finishing jobs drains quickly).
-- Every tick that fires nothing sweeps; one that fires jobs sweeps only if the partition's last
-- sweep by a firing tick (meta 'tsw', ms) is FIRING_SWEEP_MS old or more: with the hand-off lead
-- a busy partition ticks about once per job, and the writers (ack, cancel, schedule) already
-- sweep three entries per tombstone they write (_lib_finish.lua), which keeps up on its own. At
-- 100 ms these sweeps were 7 % of Redis's CPU at 1 000 jobs/s (0.3 HSCAN of ~256 entries per job).
-- Rings (ring() in _lib.lua) the bell of each queue whose ready list received jobs (its burst bell
-- when it received a burst: BURST_RING jobs or more due within BURST_SPAN_MS, bursty), once, off a
-- cluster (not a queue paused in this partition); on a cluster it names those queues in the reply
-- instead (see Returns).
-- Uses: BATCH_LIMIT_MAX, BURST_RING, CHAN, COMMON, HISTORY_TTL_S, ID_LEN, K_C, K_D, K_E, K_F, K_G, K_J, K_K,
--       K_M, K_META, K_Q, K_T, K_X, LAYOUT, MAX_INT, MAX_MS, NAME_MAX, NAME_PATTERN, PART, PREFIX,
--       arg, bell_ring, bump, burst_score, bursty, check_epoch, common_ok, cron_advance, error_blob, flag,
--       flush_bumps, fmt, head_score, jget, jval, layout_fence, multi, now_ms, p48, paused_here, queue_name,
--       rec_is_cron, rec_opts, rec_qidx, rec_valid, refusal, release_key, retire_queues, ring,
--       tally, tombstone, trim_dead, trim_tombstones, u16, u32
local FIRING_SWEEP_MS = 1000
-- Fast path: the common tick of a busy partition, which the tier sends on all but about one tick
-- per second per partition (housekeeping 0, no rate-limited queue, no retention pass): due jobs,
-- none of them a cron occurrence, a misfire or a record that names no queue, and no tombstone sweep
-- due. It runs before the library (see "--@library" below), so Redis does not build the closures
-- the general path needs (callgrind: most of a one-job tick's instructions), and writes exactly
-- what the general path writes, in the same state and reply; anything else (a refusal, an idle
-- tick, a sweep due, a job the general path must look at) falls through to the general path
-- before any write. tests/integration/test_tick_fast_path.py compares the two.
local A = ARGV
if #A == 12 and A[7] == '0' and A[8] == '0' and A[9] == '0' and A[10] == '0' and A[12] == '0' and
    (#KEYS == 14 or #KEYS == 1) then
  local call, string, tonumber, prefix = redis.call, string, tonumber, A[1]
  local plain = A[2] ~= prefix
  -- ARGV 1-3, KEYS[1] and the channel prefix as COMMON reads them (_lib_args.lua), then the epoch,
  -- batch, tombstone ttl and lead as digits (their ranges below)
  local ns, p, count, epoch_s, batch_s, ttl_s, lead_s = string.match(
    prefix .. '|' .. A[3] .. '|' .. KEYS[1] .. '|' .. (plain and A[2] or '') .. '|' .. A[4] .. '|' .. A[5] .. '|' ..
      A[6] .. '|' .. A[11],
    plain and '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|%1:|(%d+)|(%d+)|(%d+)|(%d+)$' or
      '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t||(%d+)|(%d+)|(%d+)|(%d+)$')
  local epoch, batch = tonumber(epoch_s or ''), tonumber(batch_s or '')
  if common_ok(ns, p, count, A[3]) and
      #epoch_s <= 16 and epoch <= MAX_INT and batch >= 1 and batch <= BATCH_LIMIT_MAX and
      (#ttl_s < 15 or (#ttl_s == 15 and ttl_s <= '253402300799999')) and
      (#lead_s < 15 or (#lead_s == 15 and lead_s <= '253402300799999')) then
    local k_meta = KEYS[13] or prefix .. 'meta'
    local m = call('HMGET', k_meta, 'layout', 'epoch', 'tsw')
    local cur = tonumber(m[2] or '0')
    local t = call('TIME')
    local us = tonumber(t[2])
    local now = tonumber(t[1]) * 1000 + (us - us % 1000) / 1000
    local swept = tonumber(m[3] or '0')
    local k_t = KEYS[1]
    if not (count ~= '' and m[1] and m[1] ~= count) and not (epoch > 0 and epoch < cur) and
        now - swept < FIRING_SWEEP_MS and now >= swept then
      local due = call('ZRANGE', k_t, '-inf', string.format('%d', now + tonumber(lead_s)), 'BYSCORE', 'LIMIT',
        '0', batch_s, 'WITHSCORES')
      local nd = #due / 2
      -- every job: a valid record of a queue this partition knows, not a cron occurrence, not
      -- past a misfire grace (skip policy)
      local names, per_queue, order, jargs, late, ok = {}, {}, {}, {}, {}, nd > 0
      local dues = {} -- per queue: its jobs' due times, the due ones as now (bursty)
      for i = 1, #due, 2 do
        local member = due[i]
        local rec, score = string.sub(member, ID_LEN + 1), tonumber(due[i + 1])
        local flags = string.byte(rec, 5)
        if not rec_valid(rec) or flag(flags, 16) or (flag(flags, 1) and now - score > u32(rec, 10)) then
          ok = false
          break
        end
        local idx = u16(rec, 1)
        local q = names[idx]
        if q == nil then
          q = call('HGET', KEYS[10] or prefix .. 'q', 'i:' .. string.format('%d', idx))
          names[idx] = q
        end
        if not q then ok = false; break end
        local ids = per_queue[q]
        if not ids then ids = {}; per_queue[q] = ids; dues[q] = {}; order[#order + 1] = q end
        local id = string.sub(member, 1, ID_LEN)
        ids[#ids + 1] = id
        local dq = dues[q]
        dq[#dq + 1] = score > now and score or now
        jargs[#jargs + 1] = id
        jargs[#jargs + 1] = p48(score) .. rec
        late[#late + 1] = now - score
      end
      if ok then
        if epoch > cur then call('HSET', k_meta, 'epoch', epoch_s) end
        local k_m = KEYS[2] or prefix .. 'm'
        if call('HLEN', k_m) > 0 then
          for i = 1, #jargs, 2 do call('HDEL', k_m, jargs[i]) end
        end
        call('ZREMRANGEBYRANK', k_t, '0', string.format('%d', nd - 1))
        multi('HSET', KEYS[3] or prefix .. 'j', jargs)
        local to_ring, bell = {}, '{' .. ns .. '}:bell:'
        local k_g, k_c = KEYS[11] or prefix .. 'g', KEYS[12] or prefix .. 'c'
        local hk = prefix .. 'hist:' .. string.format('%d', (now - now % 60000) / 60000) -- tally's minute
        for _, q in ipairs(order) do
          local ids = per_queue[q]
          multi('LPUSH', prefix .. 'r:' .. q, ids)
          call('HINCRBY', k_g, 's:' .. q, string.format('%d', -#ids))
          call('HINCRBY', k_c, 'fired:' .. q, string.format('%d', #ids))
          if call('HINCRBY', hk, 'fired:' .. q, string.format('%d', #ids)) == #ids then
            call('EXPIRE', hk, HISTORY_TTL_S)
          end
          if call('HEXISTS', prefix .. 'paused', q) == 0 then
            local burst = #ids >= BURST_RING and bursty(dues[q])
            if plain then
              bell_ring(bell .. q, p, string.format('%d', now), burst)
            else
              to_ring[#to_ring + 1] = q
              to_ring[#to_ring + 1] = burst and 1 or 0
            end
          end
        end
        local head = call('ZRANGE', k_t, '0', '0', 'WITHSCORES')
        local out = {nd, head[2] and tonumber(head[2]) or -1, now, 0, 0, 0, #to_ring / 2}
        for _, q in ipairs(to_ring) do out[#out + 1] = q end
        out[#out + 1] = head[2] and burst_score(k_t) or -1
        for _, v in ipairs(late) do out[#out + 1] = v end
        return out
      end
    end
  end
end
--@library
-- General path. Arguments: tested inline, with the numbers the script uses (a good call pays for no
-- closure or call: _lib_args.lua "Argument checks"); when the test fails, the same rules again through
-- arg, which names the culprit. The two lists go together.
local A = ARGV
local epoch, limit, ttl, nlim = tonumber(A[4] or ''), tonumber(A[5] or ''), tonumber(A[6] or ''), 0
if A[7] ~= nil and A[7] ~= '' then nlim = tonumber(A[7]) end
local at = 8 + 2 * (nlim or 0)
local dead_ttl, max_dead, queue_idle, lead = 0, 0, 0, 0 -- optional, in this order: absent or '' is 0
if A[at] ~= nil and A[at] ~= '' then dead_ttl = tonumber(A[at]) end
if A[at + 1] ~= nil and A[at + 1] ~= '' then max_dead = tonumber(A[at + 1]) end
if A[at + 2] ~= nil and A[at + 2] ~= '' then queue_idle = tonumber(A[at + 2]) end
if A[at + 3] ~= nil and A[at + 3] ~= '' then lead = tonumber(A[at + 3]) end
local housekeeping = 1 -- optional: absent or '' is 1
if A[at + 4] ~= nil and A[at + 4] ~= '' then housekeeping = tonumber(A[at + 4]) end
local tokens, used, newly, lim_order = {}, {}, {}, {}
local good = COMMON and (#KEYS == 14 or #KEYS == 1) and epoch and epoch >= 0 and epoch <= MAX_INT and
  epoch % 1 == 0 and limit and limit >= 1 and limit <= BATCH_LIMIT_MAX and limit % 1 == 0 and ttl and ttl >= 0 and ttl <= MAX_MS and
  ttl % 1 == 0 and nlim and nlim >= 0 and nlim % 1 == 0 and #A <= at + 4 and (nlim == 0 or #A >= at - 1) and
  dead_ttl and dead_ttl >= 0 and dead_ttl <= MAX_MS and dead_ttl % 1 == 0 and max_dead and max_dead >= 0 and
  max_dead <= MAX_INT and max_dead % 1 == 0 and queue_idle and queue_idle >= 0 and queue_idle <= MAX_MS and
  queue_idle % 1 == 0 and lead and lead >= 0 and lead <= MAX_MS and lead % 1 == 0 and
  (housekeeping == 0 or housekeeping == 1)
for i = 0, (good and nlim or 0) - 1 do -- rate-limited queues: a name and its tokens, each queue once
  local q, n = A[8 + i * 2], tonumber(A[9 + i * 2])
  if #q <= NAME_MAX and string.find(q, NAME_PATTERN) and tokens[q] == nil and n and n >= 0 and
      n <= MAX_INT and n % 1 == 0 then
    tokens[q], used[q], newly[q] = n, 0, 0
    lim_order[#lim_order + 1] = q
  else
    good = false
  end
end
if not good then
  if not (COMMON and (#KEYS == 14 or #KEYS == 1)) then return arg('common', 1) end
  arg('int', 4, 'epoch', 0, MAX_INT)
  arg('int', 5, 'batch', 1, BATCH_LIMIT_MAX)
  arg('int', 6, 'tombstone_ttl_ms', 0, MAX_MS)
  nlim = arg('int', 7, 'rate_limited_queues', 0, MAX_INT, 0)
  if nlim and (#ARGV > 12 + 2 * nlim or (nlim > 0 and #ARGV < 7 + 2 * nlim)) then
    arg('refuse', 'ARGV', 'count', '7 + 2 x ARGV[7] (the rate-limited queues), then up to 5 optional ones', #ARGV)
  end
  local seen = {}
  for i = 0, (refusal and 0 or nlim) - 1 do
    local q = arg('name', 8 + i * 2, 'queue')
    if q and seen[q] then arg('refuse', 8 + i * 2, 'queue', 'each rate-limited queue once', q) end
    if q then seen[q] = true end
    arg('int', 9 + i * 2, 'tokens', 0, MAX_INT)
  end
  arg('int', at, 'dead_ttl_ms', 0, MAX_MS, 0)
  arg('int', at + 1, 'max_dead', 0, MAX_INT, 0)
  arg('int', at + 2, 'queue_idle_ms', 0, MAX_MS, 0)
  arg('int', at + 3, 'handoff_lead_ms', 0, MAX_MS, 0)
  arg('int', at + 4, 'housekeeping', 0, 1, 1)
  return refusal or arg('refuse', 'ARGV', 'arguments', "those of lua/tick.lua's header", #ARGV)
end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local refused = check_epoch(K_META, epoch)
if refused then return {-1, refused} end
local now = now_ms()
local out = {0, -1, now, nlim}
local horizon = now + lead
-- queues no longer limited may still have held jobs: release them without a token limit (looked
-- for on housekeeping ticks only: the gauges hash has a field per queue and state)
local gauges = housekeeping == 1 and redis.call('HGETALL', K_G) or {}
for i = 1, #gauges, 2 do
  local f = gauges[i]
  if string.sub(f, 1, 2) == 'h:' and tonumber(gauges[i + 1]) > 0 then
    local q = string.sub(f, 3)
    if tokens[q] == nil then
      tokens[q], used[q], newly[q] = limit, 0, 0
      lim_order[#lim_order + 1] = q
    end
  end
end
local lateness = {}
local crons = {}
local function attention(name) if name then crons[#crons + 1] = name end end
local per_queue = {}
local moved = 0
local dues = {} -- per queue: its fired jobs' due times, the due ones as now (bursty)
local function fire(id, q, due)
  local ids = per_queue[q]
  if not ids then ids = {}; per_queue[q] = ids; dues[q] = {} end
  ids[#ids + 1] = id
  local dq = dues[q]
  dq[#dq + 1] = due > now and due or now
  lateness[#lateness + 1] = now - due
end

-- 1. release held (rate-limited) jobs, oldest first, one token each
for _, q in ipairs(lim_order) do
  local n = math.min(tokens[q], limit)
  if n > 0 then
    local hk = PREFIX .. 'h:' .. q
    local held = redis.call('ZRANGE', hk, 0, n - 1, 'WITHSCORES')
    for i = 1, #held, 2 do
      local id, due = held[i], tonumber(held[i + 1])
      local rec = jget(K_J, id)
      bump(K_G, 's:' .. q, -1)
      bump(K_G, 'h:' .. q, -1)
      local grace = rec and rec_opts(rec)
      if not rec then
        -- body missing: nothing to fire (cannot happen while invariants hold)
      elseif grace and now - due > grace then
        redis.call('HDEL', K_J, id)
        tombstone(K_E, K_F, id, 'm', now, ttl, rec, due) -- also drops its last error
        release_key(K_K, id, rec)
        bump(K_C, 'misfired:' .. q)
        if rec_is_cron(rec) then attention(select(2, cron_advance(id, rec, now, true))) end
      else
        if rec_is_cron(rec) then
          local rec2, name = cron_advance(id, rec, now, false)
          attention(name)
          if rec2 ~= rec then redis.call('HSET', K_J, id, jval(rec2, due)) end
        end
        fire(id, q, due)
        used[q] = used[q] + 1
      end
    end
    if #held > 0 then redis.call('ZREMRANGEBYRANK', hk, 0, #held / 2 - 1) end
    moved = moved + #held / 2
  end
end

-- 2. due timers
local due = redis.call('ZRANGE', K_T, '-inf', fmt(horizon), 'BYSCORE', 'LIMIT', '0', fmt(limit), 'WITHSCORES')
local nd = #due / 2
if nd > 0 then
  local has_moved = redis.call('HLEN', K_M) > 0
  local jargs = {}
  for i = 1, #due, 2 do
    local member, score = due[i], tonumber(due[i + 1])
    local id, rec = string.sub(member, 1, ID_LEN), string.sub(member, ID_LEN + 1)
    if has_moved then redis.call('HDEL', K_M, id) end
    local q = rec_valid(rec) and queue_name(K_Q, rec_qidx(rec))
    if not q then
      redis.call('HSET', K_J, id, jval(rec, score))
      redis.call('ZADD', K_D, now, id)
      redis.call('HSET', K_E, id, error_blob(now, 'CorruptRecord', 'job record is malformed or names an unknown queue'))
    else
      local grace = rec_opts(rec)
      if grace and now - score > grace then
        bump(K_G, 's:' .. q, -1)
        tombstone(K_E, K_F, id, 'm', now, ttl, rec, score) -- also drops its last error
        release_key(K_K, id, rec)
        bump(K_C, 'misfired:' .. q)
        if rec_is_cron(rec) then attention(select(2, cron_advance(id, rec, now, true))) end
      elseif tokens[q] ~= nil and used[q] >= tokens[q] then
        -- rate-limited and out of tokens: hold it (still counted as scheduled)
        jargs[#jargs + 1] = id
        jargs[#jargs + 1] = jval(rec, score)
        redis.call('ZADD', PREFIX .. 'h:' .. q, score, id)
        bump(K_G, 'h:' .. q)
        newly[q] = newly[q] + 1
      else
        bump(K_G, 's:' .. q, -1)
        if rec_is_cron(rec) then
          local name
          rec, name = cron_advance(id, rec, now, false)
          attention(name)
        end
        jargs[#jargs + 1] = id
        jargs[#jargs + 1] = jval(rec, score)
        fire(id, q, score)
        if tokens[q] ~= nil then used[q] = used[q] + 1 end
      end
    end
  end
  redis.call('ZREMRANGEBYRANK', K_T, '0', fmt(nd - 1))
  if #jargs > 0 then multi('HSET', K_J, jargs) end
  moved = moved + nd
end

local to_ring = {} -- on a cluster: the queues whose bells the caller rings (the bells are in another slot)
local sharded = string.byte(CHAN, 1) == 123
for q, ids in pairs(per_queue) do
  multi('LPUSH', PREFIX .. 'r:' .. q, ids)
  tally(K_C, PREFIX, 'fired:' .. q, #ids, now)
  -- a burst rings the burst bell: BURST_RING of the queue's jobs due within BURST_SPAN_MS (bursty)
  local burst = #ids >= BURST_RING and bursty(dues[q])
  if not sharded then
    ring(CHAN, PREFIX, q, PART, now, burst and BURST_RING or 1) -- ring's count: BURST_RING rings the burst bell
  elseif not paused_here(PREFIX, q) then
    to_ring[#to_ring + 1] = q
    to_ring[#to_ring + 1] = burst and 1 or 0
  end
end
for i = 1, nlim do
  local q = lim_order[i]
  if newly[q] > 0 then bump(K_C, 'ratelimited:' .. q, newly[q]) end
  out[#out + 1] = q
  out[#out + 1] = used[q]
  out[#out + 1] = redis.call('ZCARD', PREFIX .. 'h:' .. q)
  out[#out + 1] = newly[q]
end
out[#out + 1] = #crons
for _, name in ipairs(crons) do out[#out + 1] = name end
local dropped = (dead_ttl > 0 or max_dead > 0) and trim_dead(now, dead_ttl, max_dead, limit) or {}
out[#out + 1] = #dropped / 2
for _, v in ipairs(dropped) do out[#out + 1] = v end
out[#out + 1] = #to_ring / 2
for _, q in ipairs(to_ring) do out[#out + 1] = q end
retire_queues(now, queue_idle, 64)
local trim_more = false
if moved == 0 then
  trim_more = trim_tombstones(K_META, K_F, K_X, now, limit)
else
  local swept = tonumber(redis.call('HGET', K_META, 'tsw') or '0')
  if now - swept >= FIRING_SWEEP_MS or now < swept then
    redis.call('HSET', K_META, 'tsw', fmt(now))
    trim_more = trim_tombstones(K_META, K_F, K_X, now, limit)
  end
end
flush_bumps()
out[1] = nd  -- timers consumed: a full batch means "call again"
if trim_more and nd < limit then out[1] = limit end -- expired tombstones left: call again too
out[2] = head_score(K_T) or -1
out[#out + 1] = out[2] >= 0 and burst_score(K_T) or -1
for _, v in ipairs(lateness) do out[#out + 1] = v end
return out
