-- schedule: create jobs (scheduled, or ready when already due).
-- KEYS: the partition's timer set (t) alone, or the 14 partition keys (on a Redis Cluster); the
--       other partition keys are named from the prefix (see K_T in _lib.lua).
-- ARGV: 1-3 common; 4 queue name; 5 tombstone ttl ms; 6 job count n; 7 re-send flag (1 when the
--       client sends this call again after a lost reply, else 0);
--       then n triples: blob (id(15) .. record with a 2-byte placeholder queue index), run_at,
--       idempotency key ('' for none). run_at is absolute epoch ms, or for a time relative to
--       "now" (a timedelta) "ESTrDELTA": the client's estimate of the absolute time in Redis's
--       clock and the offset in ms. The script resolves it against its own clock (TIME, C.at in
--       _lib.lua): the job is due at now + DELTA, so a producer whose clock is off cannot fire a
--       job early or misfire it. When the estimate is within RELATIVE_SLACK_MS of that it is kept
--       (the id embeds it, and a timer whose score is its id's time needs no 'm' entry).
-- Refuses (ZSCHED_ARG, before any write; _lib_args.lua "Argument checks"), besides bad ARGV 1-3 or
--       KEYS: a queue that is not a queue name, a tombstone_ttl_ms outside 0 to 9999-12-31 in ms,
--       a count outside 1-1000 (calls.BATCH) or not matching the number of arguments, a resend
--       flag other than 0 or 1, and any job whose blob is shorter than an id and a record or whose
--       record is not one codec.build_record makes (record_problem: attempt 0, max_attempts 1-255,
--       known flags, sections that fit, lease and grace in range, its key section the key
--       argument, a trace section a W3C trace context), whose run_at is not epoch ms up to 9999-12-31 or "ESTrDELTA" landing in that
--       range, or whose key is longer than 200 bytes or starts with "cron:" (reserved for cron
--       occurrences; the client refuses them too). Every job is checked before the first is
--       written: a batch whose 5th run_at is bad writes nothing.
-- Returns: {now_ms, m, positions (1-based) of the m jobs that misfired at schedule time..., ids
--          in order (15 bytes each)}; for a key that is already live, the existing id.
-- Retry safety: ids are made by the client, so a re-sent call carries the same ids. With the
-- re-send flag, a job whose id already exists in any state (or as a tombstone) is left alone and
-- its id returned: the call is idempotent. The first send skips that check (new random ids
-- cannot exist), so the common path costs nothing extra.
-- Invariants: a new job enters exactly one state: timer set 't' (score run_at), or 'j' + ready
-- list when run_at <= now, or a 'misfired' tombstone when it is due, skip-policy and past grace.
-- An idempotency key maps to at most one live job. The owner is woken (pub/sub) only when a job
-- lands before the partition's current earliest timer.
-- Paths: a fast path for one new job due later in a queue the partition knows (the common
-- producer call; it runs before most of the library's definitions), else the general path.
-- Rings (ring() in _lib.lua) the queue's bell with the partition number when jobs landed in the
-- ready list (its burst bell when BURST_RING or more did); publishes on CHAN.."wake" when one landed before the earliest timer.
-- Fast path: one new job (not a re-send), no idempotency key, due later, in a queue this
-- partition already knows: the common producer call. It runs before the library (see
-- "--@library" below) but for the helper it calls (record_problem), so Redis does
-- not build the other closures on this path (measured with callgrind: about a fifth of a one-job
-- call's instructions), and passes numbers to Redis as the strings it already has (a Lua number
-- argument is formatted with %.17g, another tenth). It tests its arguments inline with the values
-- it reads anyway and takes only a call the general path would take: a queue name the partition
-- has interned was checked when it was interned. It ends in exactly the state and reply of the
-- general path below; anything else (a refusal, a new queue name, a job already due, a time whose
-- id must be noted in 'm') falls through to the general path before any write, which names a
-- refused argument. tests/integration/test_schedule_fast_path.py compares the two.
-- Re-send flag: ARGV[7]
-- Uses: BATCH_MAX, CHAN, COMMON, ID_LEN, KEY_MAX, K_C, K_E, K_F, K_G, K_J, K_K, K_M, K_META, K_Q,
--       K_T, LAYOUT, MAX_MS, NAME_MAX, NAME_PATTERN, PART, PREFIX, arg, bump, flag, flush_bumps,
--       fmt, head_score, job_exists, jval, layout_fence, multi, now_ms, p16, queue_index, rec_opts,
--       record_problem, refusal, release_key, ring, sweep_after_tombstones, tally, tombstone,
--       touch_queue, u48, wake_scheduler
local RELATIVE_SLACK_MS = 250 -- see the use of arg('at') below
local A = ARGV -- a local: each ARGV[i] would otherwise look the global up
if A[6] == '1' and A[7] == '0' and A[10] == '' and A[11] == nil and (#KEYS == 1 or #KEYS == 14) then
  -- One pattern reads ARGV 1-3, KEYS[1] and the channel prefix as COMMON does (_lib_args.lua: the same
  -- pattern, and below the same limits), then the ttl and run_at (digits, then '' or "rDELTA"):
  -- the three pattern calls this path made before its arguments were checked cost nearly as much.
  -- locals: a global costs a table lookup at each use
  local call, string, tonumber, k_t, prefix, queue = redis.call, string, tonumber, KEYS[1], A[1], A[4]
  local plain = A[2] ~= prefix
  local ns, p, count, rel = string.match(
    prefix .. '|' .. A[3] .. '|' .. k_t .. '|' .. (plain and A[2] or '') .. '|' .. A[5] .. '|' .. A[9],
    plain and '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t|%1:|%d+|%d+(r?%-?%d*)$' or
      '^{([A-Za-z0-9][A-Za-z0-9_.%-]*):(%d+)}:|%2/?(%d*)|{%1:%2}:t||%d+|%d+(r?%-?%d*)$')
  local ttl, blob = A[5], A[8]
  local ra, rm, rf = string.byte(blob, 18, 20) -- the record's attempt, max_attempts and flags
  if ns and #ns <= 64 and #p <= 4 and not (#p == 4 and p > '4095') and #count <= 4 and
      not (#count == 4 and count > '4096') and (#count > #p or (#count == #p and count > p)) and
      (#ttl < 15 or (#ttl == 15 and ttl <= '253402300799999')) and #blob >= 24 and
      (rf == 0 and ra == 0 and rm > 0 or not record_problem(blob, ID_LEN, '')) then
    local l = call('HGET', prefix .. 'meta', 'layout')
    local k_q = prefix .. 'q'
    local qidx = not (l and l ~= count) and call('HGET', k_q, 'n:' .. queue)
    if qidx then
      local t = call('TIME')
      local us = tonumber(t[2])
      local now = tonumber(t[1]) * 1000 + (us - us % 1000) / 1000
      local at, at_s = nil, nil
      if rel == '' then
        at, at_s = tonumber(A[9]), A[9]
      elseif string.byte(rel) == 114 and #rel > 1 and rel ~= 'r-' then -- "ESTrDELTA": due at now + DELTA
        local due = now + tonumber(string.sub(rel, 2))
        local est = string.sub(A[9], 1, #A[9] - #rel)
        if due >= 0 and due <= MAX_MS and math.abs(due - tonumber(est)) <= RELATIVE_SLACK_MS then at, at_s = tonumber(est), est end
      end
      if at and at > now and at <= MAX_MS then
        local id, n = string.sub(blob, 1, 15), tonumber(qidx)
        call('HSET', k_q, 'u:' .. qidx, string.format('%d', now))
        local earlier = call('ZCOUNT', k_t, '-inf', at_s) -- timers due at or before this one
        call('ZADD', k_t, at_s, id .. string.char((n - n % 256) / 256, n % 256) .. string.sub(blob, 18))
        call('HINCRBY', prefix .. 'c', 'scheduled:' .. queue, '1')
        call('HINCRBY', prefix .. 'g', 's:' .. queue, '1')
        if earlier == 0 then
          call(string.byte(A[2], 1) == 123 and 'SPUBLISH' or 'PUBLISH', A[2] .. 'wake', p)
        end
        return {now, 0, id}
      end
    end
  end
end
--@library
-- General path. Every argument is checked first, every job before the first is written.
-- ARGV 1-7: tested inline (a keyed or due job, a new queue, every schedule_many batch comes here),
-- named through arg when the test failed. The two lists go together.
local queue, ttl, n, resend = ARGV[4], tonumber(ARGV[5] or ''), tonumber(ARGV[6] or ''), ARGV[7]
if not (COMMON and (#KEYS == 1 or #KEYS == 14) and queue and #queue <= NAME_MAX and string.find(queue, NAME_PATTERN) and
    ttl and ttl >= 0 and ttl <= MAX_MS and ttl % 1 == 0 and n and n >= 1 and n <= BATCH_MAX and n % 1 == 0 and
    (resend == '0' or resend == '1') and #ARGV == 7 + 3 * n) then
  if not (COMMON and (#KEYS == 1 or #KEYS == 14)) then return arg('common', 1) end
  arg('name', 4, 'queue')
  arg('int', 5, 'tombstone_ttl_ms', 0, MAX_MS)
  n = arg('int', 6, 'count', 1, BATCH_MAX)
  arg('flag', 7, 'resend')
  if n and #ARGV ~= 7 + 3 * n then arg('refuse', 'ARGV', 'count', '7 + 3 x ARGV[6] (the job count)', #ARGV) end
  return refusal or arg('refuse', 'ARGV', 'arguments', "those of lua/schedule.lua's header", #ARGV)
end
resend = resend == '1'
local now = now_ms()
local ats, ests = {}, {}
for i = 1, n do
  local b = 5 + 3 * i
  local blob, key = ARGV[b], ARGV[b + 2]
  local problem = record_problem(blob, ID_LEN, key)
  if key ~= '' and (#key > KEY_MAX or string.sub(key, 1, 5) == 'cron:') then
    arg('refuse', b + 2, 'key', "'' or an idempotency key of 1-200 bytes, not starting with \"cron:\" (reserved for " ..
      'cron occurrences)', key)
  elseif problem then
    arg('refuse', b, 'job', 'an id (15 bytes), then ' .. problem, blob)
  end
  ats[i], ests[i] = arg('at', b + 1, 'run_at', now)
  if refusal then return refusal end
end
do local refused = layout_fence(K_META, LAYOUT); if refused then return refused end end
local qidx = queue_index(PREFIX, K_Q, queue)
-- Always a write, also on a re-send that finds every job already there: WAIT (durable=) counts
-- the replicas that have this connection's last write, so a call that wrote nothing would be
-- "confirmed" before the replicas had the first send's jobs.
touch_queue(K_Q, qidx, now)
local qb = p16(qidx)
local out, zargs, jargs, ready_ids, misfired, moved = {}, {}, {}, {}, {}, {}
local head = head_score(K_T)
local earliest = nil
for i = 0, n - 1 do
  local b = 8 + i * 3
  local blob, key = ARGV[b], ARGV[b + 2]
  local at, est = ats[i + 1], ests[i + 1]
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
        tombstone(K_E, K_F, id, 'm', now, ttl, rec, at)
        release_key(K_K, id, rec)
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
  tally(K_C, PREFIX, 'fired:' .. queue, #ready_ids, now)
  ring(CHAN, PREFIX, queue, PART, now, #ready_ids)
end
flush_bumps()
sweep_after_tombstones(K_META, K_F, now)
if earliest and (head == nil or earliest < head) then wake_scheduler(CHAN, PART) end
local reply = {now, #misfired}
for _, pos in ipairs(misfired) do reply[#reply + 1] = pos end
for _, id in ipairs(out) do reply[#reply + 1] = id end
return reply
