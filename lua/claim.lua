-- claim: ready -> running. Run by workers.
-- KEYS: the 14 partition keys (see _lib.lua), or off a Redis Cluster the timer set alone, the others
--   named from the prefix (scheduler/protocol/calls.py ONE_KEY_OFF_CLUSTER).
-- ARGV: 1-3 common; 4 queue name; 5 max jobs to claim; 6 request id (optional, '' for none);
--       7 receipt ttl ms (with a request id); 8 an earlier request id of the same caller whose
--       reply arrived, so its receipt can go now (optional, '' for none); 9 the most jobs that
--       are already due (due_ms <= now) to take (optional, default: all of them): a worker
--       claims jobs handed off ahead of their due time into its prefetch allowance and the due
--       ones only into free handler slots. Jobs are taken in list order; at the first due job
--       over that limit the claim stops and it and the rest go back to the consuming end of the
--       list, in their order.
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"): bad ARGV 1-3 or KEYS, a
--   queue that is not a queue name, max_jobs outside 1-5000, a request id (request_id, and the
--   earlier one) longer than 64 bytes, a receipt_ttl_ms outside 1 ms to a day with a request id
--   (0 to a day, '' or absent without one), a max_due that is neither '' nor 0 to 2^53 - 1, more
--   than 9 arguments. Tested inline, with the values the script uses; arg names the culprit when
--   that test fails.
-- Returns: {now_us, id, record, token, deadline_ms, due_ms, id, ...}; just {now_us} when empty;
--   {now_us, paused_since_ms} (2 elements) when the queue is paused (PREFIX..'paused', lua/pause.lua).
--   now_us: the server's TIME in microseconds, so a worker can start a job handed off ahead of
--   its due time (tick's hand-off lead) at that time by Redis's clock, never before.
--   due_ms: when this attempt became due (its fire time), for end-to-end lateness.
-- Rings (ring() in _lib.lua, off a cluster) the queue's bell when it leaves jobs in the ready list
-- (it took as many as asked for and more wait, or it stopped at its due limit), so another idle
-- worker takes them now: its burst bell when BURST_RING jobs or more are left; on a cluster the
-- worker rings it (the bell is in another slot), except after a claim with a due limit of 0 that
-- stopped at a due job: its reply is empty, so the script relays that ring ("r P QUEUE", or
-- "b P QUEUE" for BURST_RING or more, on the partition's wake channel) for the owner to ring.
-- Retry safety: with a request id, the claimed ids are kept in a receipt PREFIX.."cr:"..rid for
-- the receipt ttl; a re-sent claim (same request id, e.g. after its reply was lost to a timeout)
-- returns the jobs of the receipt that still hold the tokens it gave them, and claims nothing new.
-- Without the receipt the lost jobs would sit leased to nobody until their lease expired, with
-- an attempt spent.
-- Invariants: a job popped from the ready list is in 'i' (score = lease deadline) with a new
-- token in 'l' in the same script, so a claimed job always has a lease; a malformed body goes to
-- 'd' (CorruptRecord) instead, never lost. attempt + 1 is written to
-- the record. Tokens come from next_tokens (a per-partition counter kept above the server clock
-- in microseconds): every claim of a job gets a larger token, which is the job's fence, even
-- after Redis lost recent writes. An id that is already running (a duplicate ready entry: only
-- a bug or a hand edit makes one) is dropped from the list, never handed out twice. A job over
-- the due limit (ARGV 9) leaves the list only to go back to the same place in the same script.
-- Uses: BATCH_LIMIT_MAX, BATCH_MAX, BURST_RING, CHAN, COMMON, ID_LEN, K_C, K_D, K_E, K_G, K_I, K_J, K_L,
--       K_META, LAYOUT, MAX_INT, NAME_MAX, NAME_PATTERN, PART, PREFIX, arg, bell_ring, bump, common_ok,
--       error_blob, flush_bumps, fmt, jget, jval, keep_due_over, layout_fence, multi, next_tokens,
--       rec_attempt, rec_opts, rec_valid, rec_with_attempt, refusal, ring, tally, u32, u48
local RECEIPT_MAX_MS = 86400000 -- a day: a receipt answers re-sends after a lost reply, seconds later
-- Fast path: a worker's claim as workers/fetch.py sends it (a request id with its receipt ttl, a
-- due-job limit, at most BATCH_MAX jobs) of a queue that is not paused, with no receipt to answer
-- from, whose popped jobs are all valid records not already running. It runs before the library
-- (see "--@library" below), so Redis does not build the closures the general path needs
-- (callgrind: a third of a one-job claim's instructions), reads meta's layout and fence in one
-- HMGET, and writes exactly what the general path writes, in the same state and reply. Anything
-- else falls through to the general path: a refusal, a re-sent claim or a paused queue before any
-- write; a popped job the general path must look at (a corrupt record, one already running, a
-- missing body) after putting the popped ids back where they were, which leaves the state as it
-- was (the earlier receipt's DEL aside, which the general path repeats). tests/integration/
-- test_claim_fast_path.py compares the two.
local A = ARGV
if #A == 9 and (#KEYS == 14 or #KEYS == 1) and A[6] ~= '' and #A[6] <= 64 and #A[8] <= 64 then
  local call, string, tonumber, prefix, queue = redis.call, string, tonumber, A[1], A[4]
  local plain = A[2] ~= prefix
  -- ARGV 1-3, KEYS[1] and the channel prefix as COMMON reads them (_lib_args.lua), then the job
  -- count, receipt ttl and due limit as digits (their ranges below)
  local ns, p, count, n_s, ttl_s, due_s = string.match(
    prefix .. '|' .. A[3] .. '|' .. KEYS[1] .. '|' .. (plain and A[2] or '') .. '|' .. A[5] .. '|' .. A[7] .. '|' ..
      A[9],
    plain and '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|%1:|(%d+)|(%d+)|(%d+)$' or
      '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t||(%d+)|(%d+)|(%d+)$')
  local n, ttl, max_due = tonumber(n_s or ''), tonumber(ttl_s or ''), tonumber(due_s or '')
  if common_ok(ns, p, count, A[3]) and
      #queue <= NAME_MAX and string.find(queue, NAME_PATTERN) and n >= 1 and n <= BATCH_MAX and
      ttl >= 1 and ttl <= RECEIPT_MAX_MS and #due_s <= 16 and max_due <= MAX_INT then
    local k_meta, k_j, k_i, k_l = KEYS[13] or prefix .. 'meta', KEYS[3] or prefix .. 'j', KEYS[4] or prefix .. 'i',
      KEYS[5] or prefix .. 'l'
    local m = call('HMGET', k_meta, 'layout', 'fence')
    local receipt = prefix .. 'cr:' .. A[6]
    if not (count ~= '' and m[1] and m[1] ~= count) and not call('GET', receipt) and
        not call('HGET', prefix .. 'paused', queue) then
      local clock = call('TIME')
      local secs, micros = tonumber(clock[1]), tonumber(clock[2])
      local now = secs * 1000 + (micros - micros % 1000) / 1000
      local us = secs * 1000000 + micros
      local now_us = string.format('%d', us)
      if A[8] ~= '' then call('DEL', prefix .. 'cr:' .. A[8]) end
      local list = prefix .. 'r:' .. queue
      local ids = call('RPOP', list, string.format('%d', n))
      if not ids then return {now_us} end
      local recs = call('HMGET', k_j, unpack(ids))
      local running = call('ZMSCORE', k_i, unpack(ids))
      local ok = true
      for i = 1, #ids do
        local v = recs[i]
        if running[i] or not v or not rec_valid(string.sub(v, 7)) then ok = false; break end
      end
      if not ok then
        -- back where they were (RPOP took them from the tail, first popped first back), for the
        -- general path to pop again
        local back = {}
        for i = #ids, 1, -1 do back[#back + 1] = ids[i] end
        call('RPUSH', list, unpack(back))
      else
        local left = #ids == n
        local bell = plain and '{' .. ns .. '}:bell:' .. queue
        if max_due < #ids and keep_due_over(list, ids, recs, max_due, now) then
          if plain then
            bell_ring(bell, p, string.format('%d', now), call('LLEN', list) >= BURST_RING)
          elseif max_due == 0 then -- on a cluster: relayed (see the general path)
            ring(A[2], nil, queue, p, now, call('LLEN', list))
          end
          if #ids == 0 then return {now_us} end
          left = false -- rung
        end
        if left and plain then
          local len = call('LLEN', list)
          if len > 0 then bell_ring(bell, p, string.format('%d', now), len >= BURST_RING) end
        end
        local fence = tonumber(m[2] or '0')
        local base = (fence > us and fence or us)
        call('HSET', k_meta, 'fence', string.format('%d', base + #ids))
        local out, jargs, zargs, largs, kept = {now_us}, {}, {}, {}, {}
        for i = 1, #ids do
          local id, v = ids[i], recs[i]
          local a = string.byte(v, 9) + 1
          if a > 255 then a = 255 end
          local flags = string.byte(v, 11)
          local lease = 30000
          if flags % 16 >= 8 then lease = u32(v, flags % 2 == 1 and 20 or 16) end
          local token, deadline = base + i, now + lease
          v = string.sub(v, 1, 8) .. string.char(a) .. string.sub(v, 10)
          local tok = string.format('%016d', token)
          jargs[#jargs + 1] = id; jargs[#jargs + 1] = v
          zargs[#zargs + 1] = string.format('%d', deadline); zargs[#zargs + 1] = id
          largs[#largs + 1] = id; largs[#largs + 1] = string.format('%d', token)
          kept[#kept + 1] = id .. tok
          out[#out + 1] = id; out[#out + 1] = string.sub(v, 7); out[#out + 1] = token; out[#out + 1] = deadline
          out[#out + 1] = u48(v, 1)
        end
        call('HSET', k_j, unpack(jargs))
        call('ZADD', k_i, unpack(zargs))
        call('HSET', k_l, unpack(largs))
        call('HINCRBY', KEYS[11] or prefix .. 'g', 'a:' .. queue, string.format('%d', #ids))
        call('SET', receipt, table.concat(kept), 'PX', string.format('%d', ttl))
        return out
      end
    end
  end
end
--@library
local A = ARGV
-- Arguments: tested inline, with the values the script uses (a good call pays for no closure or
-- call: _lib_args.lua "Argument checks"); when the test fails, the same rules again through arg, which
-- names the culprit. The two lists go together.
local A = ARGV
local queue, n, rid, prev_rid = A[4], tonumber(A[5] or ''), A[6] or '', A[8] or ''
local receipt_ms = 0 -- without a request id: no receipt, ARGV[7] absent, '' or 0 up to a day
if A[7] ~= nil and A[7] ~= '' or rid ~= '' then receipt_ms = tonumber(A[7] or '') end
local max_due = -1 -- absent or '': no limit on due jobs
local due_limit = A[9] ~= nil and A[9] ~= ''
if due_limit then max_due = tonumber(A[9]) end
if not (COMMON and (#KEYS == 14 or #KEYS == 1) and queue and #queue <= NAME_MAX and
    string.find(queue, NAME_PATTERN) and
    n and n >= 1 and n <= BATCH_LIMIT_MAX and n % 1 == 0 and #rid <= 64 and #prev_rid <= 64 and receipt_ms and
    receipt_ms >= (rid == '' and 0 or 1) and receipt_ms <= RECEIPT_MAX_MS and receipt_ms % 1 == 0 and
    (not due_limit or (max_due and max_due >= 0 and max_due <= MAX_INT and max_due % 1 == 0)) and #A <= 9) then
  if not (COMMON and (#KEYS == 14 or #KEYS == 1)) then return arg('common', 1) end
  arg('name', 4, 'queue')
  arg('int', 5, 'max_jobs', 1, BATCH_LIMIT_MAX)
  rid = arg('request_id', 6)
  arg('int', 7, 'receipt_ttl_ms', rid == '' and 0 or 1, RECEIPT_MAX_MS, rid == '' and 0 or nil)
  arg('request_id', 8)
  arg('int', 9, 'max_due', 0, MAX_INT, -1)
  arg('at_most', 9)
  return refusal or arg('refuse', 'ARGV', 'arguments', "those of lua/claim.lua's header", #ARGV)
end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local clock = redis.call('TIME')
local secs, micros = tonumber(clock[1]), tonumber(clock[2])
local now = secs * 1000 + math.floor(micros / 1000)
local us = secs * 1000000 + micros
local now_us = fmt(us)
local receipt = rid ~= '' and PREFIX .. 'cr:' .. rid
if prev_rid ~= '' then redis.call('DEL', PREFIX .. 'cr:' .. prev_rid) end
if receipt then
  local prev = redis.call('GET', receipt)
  if prev then
    local out = {now_us}
    for s = 1, #prev, ID_LEN + 16 do
      local id, token = string.sub(prev, s, s + ID_LEN - 1), string.sub(prev, s + ID_LEN, s + ID_LEN + 15)
      token = fmt(tonumber(token))
      local deadline = redis.call('ZSCORE', K_I, id)
      local rec, due = jget(K_J, id)
      if deadline and rec and redis.call('HGET', K_L, id) == token then
        out[#out + 1] = id; out[#out + 1] = rec; out[#out + 1] = tonumber(token)
        out[#out + 1] = tonumber(deadline); out[#out + 1] = due
      end
    end
    return out
  end
end
-- A paused queue (lua/pause.lua) hands out nothing: its jobs wait in the ready list (tick keeps
-- filling it; misfire is decided there, never here, so waiting out a pause misfires nothing).
local paused = redis.call('HGET', PREFIX .. 'paused', queue)
if paused then return {now_us, tonumber(paused)} end
local list = PREFIX .. 'r:' .. queue
local ids = redis.call('RPOP', list, fmt(n))
if not ids then return {now_us} end
-- Jobs left behind (more than asked for, or due ones over the limit): ring the bell off a cluster,
-- so that another idle worker takes them now (a ring wakes one worker: a burst spreads over the
-- idle workers one hop at a time). On a cluster the bell is in another slot: the worker rings it.
local left = #ids == n
local recs = redis.call('HMGET', K_J, unpack(ids))
if max_due >= 0 and max_due < #ids and keep_due_over(list, ids, recs, max_due, now) then
  -- On a cluster the worker rings after a claim that took its due limit, but a claim with no
  -- handler slot (max_due 0) comes back empty, like one on an empty list: the worker cannot tell
  -- that due jobs wait, so the script relays the ring to the partition's owner ("r/b P QUEUE").
  -- Without it those jobs waited for a claim with a handler slot there, which a sweep of more
  -- partitions than handler slots might never send (bench fanout, 3-master cluster: 19 jobs
  -- ready and unclaimed for over a minute).
  if string.byte(CHAN, 1) ~= 123 or max_due == 0 then
    ring(CHAN, PREFIX, queue, PART, now, redis.call('LLEN', list))
  end
  if #ids == 0 then return {now_us} end
  left = false -- rung
end
if left and string.byte(CHAN, 1) ~= 123 then
  local len = redis.call('LLEN', list)
  if len > 0 then ring(CHAN, PREFIX, queue, PART, now, len) end
end
local running = redis.call('ZMSCORE', K_I, unpack(ids))
local base = next_tokens(K_META, #ids, us) - 1
local out, jargs, zargs, largs, kept = {now_us}, {}, {}, {}, {}
for i, id in ipairs(ids) do
  local v = recs[i]
  if running[i] then
    -- already running under another token: handing it out again would run it twice
  elseif v and not rec_valid(string.sub(v, 7)) then
    redis.call('ZADD', K_D, now, id)
    redis.call('HSET', K_E, id, error_blob(now, 'CorruptRecord', 'job record is malformed (shorter than its header or sections)'))
    bump(K_G, 'd:' .. queue)
    tally(K_C, PREFIX, 'dead:' .. queue, 1, now)
  elseif v then
    local rec, due = string.sub(v, 7), u48(v, 1)
    local a = rec_attempt(rec) + 1
    if a > 255 then a = 255 end
    rec = rec_with_attempt(rec, a)
    local _, lease = rec_opts(rec)
    local token, deadline = base + i, now + lease
    jargs[#jargs + 1] = id; jargs[#jargs + 1] = jval(rec, due)
    zargs[#zargs + 1] = fmt(deadline); zargs[#zargs + 1] = id
    largs[#largs + 1] = id; largs[#largs + 1] = fmt(token)
    if receipt then kept[#kept + 1] = id .. string.format('%016d', token) end
    out[#out + 1] = id; out[#out + 1] = rec; out[#out + 1] = token; out[#out + 1] = deadline
    out[#out + 1] = due
  end
end
if #jargs > 0 then
  multi('HSET', K_J, jargs)
  multi('ZADD', K_I, zargs)
  multi('HSET', K_L, largs)
  bump(K_G, 'a:' .. queue, #zargs / 2)
  if receipt then redis.call('SET', receipt, table.concat(kept), 'PX', fmt(receipt_ms)) end
end
flush_bumps()
return out
