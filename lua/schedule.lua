-- schedule: create jobs (scheduled, or ready when already due).
-- KEYS: the partition's timer set (t) alone; the other partition keys are named from the prefix
--       (see K_T in _lib.lua).
-- ARGV: 1-3 common; 4 queue name; 5 tombstone ttl ms; 6 job count n; 7 re-send flag (1 when the
--       client sends this call again after a lost reply, else 0);
--       then n triples: blob (id(15) .. record with a 2-byte placeholder queue index), run_at,
--       idempotency key ('' for none). run_at is absolute epoch ms, or for a time relative to
--       "now" (a timedelta) "ESTrDELTA": the client's estimate of the absolute time in Redis's
--       clock and the offset in ms. The script resolves it against its own clock (TIME, resolve_at
--       in _lib.lua): the job
--       is due at now + DELTA, so a producer whose clock is off cannot fire a job early or
--       misfire it. When the estimate is within RELATIVE_SLACK_MS of that it is kept (the id
--       embeds it, and a timer whose score is its id's time needs no 'm' entry).
-- Returns: {now_ms, m, positions (1-based) of the m jobs that misfired at schedule time..., ids
--          in order (15 bytes each)}; for a key that is already live, the existing id.
-- Retry safety: ids are made by the client, so a re-sent call carries the same ids. With the
-- re-send flag, a job whose id already exists in any state (or as a tombstone) is left alone and
-- its id returned: the call is idempotent. The first send skips that check (new random ids
-- cannot exist), so the common path costs nothing extra.
-- Invariants: a new job enters exactly one state: timer set 't' (score run_at), or 'j' + ready
-- list when run_at <= now, or a 'misfired' tombstone when it is due, skip-policy and past grace.
-- An idempotency key maps to at most one live job. Keys starting with "cron:" are refused (they
-- belong to cron occurrences; the client refuses them too). The owner is woken (pub/sub) only when a job
-- lands before the partition's current earliest timer.
-- Paths: a fast path for one new job due later in a queue the partition knows (the common
-- producer call; it runs before the library's definitions), else the general path.
-- Publishes (publish(): SPUBLISH in sharded mode): the partition number on CHAN.."ready:"..queue
-- when jobs landed in the ready list, on CHAN.."wake" when one landed before the earliest timer.
-- Fast path: one new job (not a re-send), no idempotency key, due later, in a queue this
-- partition already knows: the common producer call. It runs before the library (see
-- "--@library" below), so Redis does not build the library's closures on this path (measured with
-- callgrind: about a fifth of a one-job call's instructions), and passes numbers to Redis as the
-- strings it already has (a Lua number argument is formatted with %.17g, another tenth).
-- It ends in exactly the state and reply of the general path below; anything else (a refusal,
-- a new queue name, a job already due, a time whose id must be noted in 'm') falls through to the
-- general path before any write. tests/integration/test_schedule_fast_path.py compares the two.
local RELATIVE_SLACK_MS = 250 -- see resolve_at's use below
if ARGV[6] == '1' and ARGV[7] == '0' and ARGV[10] == '' then
  local slash = string.find(ARGV[3], '/', 1, true)
  local fenced = false
  if slash then
    local l = redis.call('HGET', ARGV[1] .. 'meta', 'layout')
    fenced = l and l ~= string.sub(ARGV[3], slash + 1)
  end
  local k_q = ARGV[1] .. 'q'
  local qidx = not fenced and redis.call('HGET', k_q, 'n:' .. ARGV[4])
  if qidx then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local arg = ARGV[9]
    local at, at_s = nil, nil
    if string.find(arg, '^%d+$') then
      at, at_s = tonumber(arg), arg
    else
      local est, delta = string.match(arg, '^(%d+)r(%-?%d+)$')
      if est and math.abs(now + tonumber(delta) - tonumber(est)) <= RELATIVE_SLACK_MS then at, at_s = tonumber(est), est end
    end
    if at and at > now then
      local blob, chan = ARGV[8], ARGV[2]
      local id, n = string.sub(blob, 1, 15), tonumber(qidx)
      redis.call('HSET', k_q, 'u:' .. qidx, string.format('%d', now))
      local earlier = redis.call('ZCOUNT', KEYS[1], '-inf', at_s) -- timers due at or before this one
      redis.call('ZADD', KEYS[1], at_s, id .. string.char(math.floor(n / 256), n % 256) .. string.sub(blob, 18))
      redis.call('HINCRBY', ARGV[1] .. 'c', 'scheduled:' .. ARGV[4], '1')
      redis.call('HINCRBY', ARGV[1] .. 'g', 's:' .. ARGV[4], '1')
      if earlier == 0 then
        redis.call(string.byte(chan, 1) == 123 and 'SPUBLISH' or 'PUBLISH', chan .. 'wake',
          slash and string.sub(ARGV[3], 1, slash - 1) or ARGV[3])
      end
      return {now, 0, id}
    end
  end
end
--@library
-- General path.
do local refused = layout_fence(); if refused then return refused end end
local queue, ttl, n, resend = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
for i = 0, n - 1 do  -- before any write: Redis does not roll a script back on error
  if string.sub(ARGV[10 + i * 3], 1, 5) == 'cron:' then
    error('zsched: idempotency keys starting with "cron:" are reserved for cron occurrences')
  end
end
local now = now_ms()
local qidx = queue_index(queue)
-- Always a write, also on a re-send that finds every job already there: WAIT (durable=) counts
-- the replicas that have this connection's last write, so a call that wrote nothing would be
-- "confirmed" before the replicas had the first send's jobs.
touch_queue(qidx, now)
local qb = p16(qidx)
local out, zargs, jargs, ready_ids, misfired, moved = {}, {}, {}, {}, {}, {}
local head = head_score()
local earliest = nil
for i = 0, n - 1 do
  local b = 8 + i * 3
  local blob, key = ARGV[b], ARGV[b + 2]
  local at, est = resolve_at(ARGV[b + 1], now)
  local id = string.sub(blob, 1, ID_LEN)
  local off_id = false -- only a relative time can differ from the time its id was made with
  if est then
    if math.abs(at - est) <= RELATIVE_SLACK_MS then at = est else off_id = at ~= u48(id, 1) end
  end
  local existing = false
  if resend and job_exists(id) then
    existing = id
  elseif key ~= '' then
    existing = redis.call('HGET', K_K, key)
    if not existing then redis.call('HSET', K_K, key, id) end
  end
  if existing then
    out[#out + 1] = existing
  else
    out[#out + 1] = id
    local rec = qb .. string.sub(blob, ID_LEN + 3)
    bump(K_C, 'scheduled:' .. queue)
    if at > now then
      zargs[#zargs + 1] = at
      zargs[#zargs + 1] = id .. rec
      if off_id then moved[#moved + 1] = id; moved[#moved + 1] = fmt(at) end
      if earliest == nil or at < earliest then earliest = at end
      bump(K_G, 's:' .. queue)
    else
      local grace = rec_opts(rec)
      if grace and now - at > grace then
        tombstone(id, 'm', now, ttl, rec, at)
        release_key(id, rec)
        bump(K_C, 'misfired:' .. queue)
        misfired[#misfired + 1] = i + 1
      else
        jargs[#jargs + 1] = id
        jargs[#jargs + 1] = jval(rec, at)
        ready_ids[#ready_ids + 1] = id
      end
    end
  end
end
if #zargs > 0 then multi('ZADD', K_T, zargs) end
if #moved > 0 then multi('HSET', K_M, moved) end
if #jargs > 0 then
  multi('HSET', K_J, jargs)
  multi('LPUSH', PREFIX .. 'r:' .. queue, ready_ids)
  bump(K_C, 'fired:' .. queue, #ready_ids)
  publish(CHAN .. 'ready:' .. queue, PART)
end
flush_bumps()
sweep_after_tombstones(now)
if earliest and (head == nil or earliest < head) then wake_scheduler() end
local reply = {now, #misfired}
for _, pos in ipairs(misfired) do reply[#reply + 1] = pos end
for _, id in ipairs(out) do reply[#reply + 1] = id end
return reply
