-- _lib.lua: helpers shared by every script: keys, record bytes, queues, timers, ready lists,
-- placing a job. One library with _lib_args.lua (read before it: the arguments every script
-- gets, and their checks), _lib_finish.lua and _lib_cron.lua (read after it). The loader
-- (scheduler/protocol/scripts.py) prepends the definitions a script uses (transitively) to it,
-- so each script is one self-contained EVALSHA.
--
-- Linking: the call's context is named once, in the library's top level: the partition's keys
-- K_T .. K_F (below) and, from ARGV 1-3 (_lib_args.lua), PREFIX, CHAN, PART and LAYOUT. A helper
-- takes what it reads of them as parameters, keys first (jget(k_j, id), ring(chan, prefix, qname,
-- member, now)), and the scripts pass the library's names, so a helper's signature says what it
-- touches and a script's Uses line names every key its helpers touch. It costs nothing: passing
-- a name is one VM move at the call, and a helper that no longer captures the name is cheaper to
-- build on every call, whether it runs or not (callgrind, bench.script_cost: schedule's general
-- path 217 k -> 211 k instructions, a one-job claim 318 k -> 316 k, tick 337 k -> 334 k).
-- Ambient, each saying so on an "Ambient:" comment line that names what it reads (checked by
-- tests/unit/test_batch.py): the helpers that find or move a job in any state or remove every
-- trace of one (job_exists, place, cancel_job, trim_dead, retire_queues, cron_schedule,
-- cron_advance), where a parameter per key would restate the partition at every call, and the
-- argument checks (arg, registry_keys), whose work is reading ARGV and KEYS. Constants (ID_LEN,
-- CHUNK, NAME_MAX, ...) are read where they are. Per-call accumulators stay module-level state,
-- shared by the helpers that fill and read them: bumps (bump,
-- flush_bumps), minute_counts and minute_key (tally, flush_bumps), ready_touched (push_ready,
-- publish_ready), qname_cache (queue_name, retire_queues),
-- tomb_written and tomb_pick (tombstone, sweep_after_tombstones, trim_tombstones). Redis runs the
-- library afresh on every EVALSHA, so they start empty on every call and hold one partition's values.
--
-- schedule declares only KEYS[1], the timer set (it routes the call in a cluster; the other keys
-- share its hash tag, so its slot), and its partition keys are named here from the prefix: the 13
-- other declared keys cost a one-job call an eighth of its Redis instructions (callgrind).
local K_T, K_M, K_J, K_I, K_L, K_D, K_E, K_K, K_X, K_Q, K_G, K_C, K_META, K_F =
  KEYS[1], KEYS[2] or PREFIX .. 'm', KEYS[3] or PREFIX .. 'j', KEYS[4] or PREFIX .. 'i',
  KEYS[5] or PREFIX .. 'l', KEYS[6] or PREFIX .. 'd', KEYS[7] or PREFIX .. 'e', KEYS[8] or PREFIX .. 'k',
  KEYS[9] or PREFIX .. 'x', KEYS[10] or PREFIX .. 'q', KEYS[11] or PREFIX .. 'g', KEYS[12] or PREFIX .. 'c',
  KEYS[13] or PREFIX .. 'meta', KEYS[14] or PREFIX .. 'f'
local ID_LEN = 15
local CHUNK = 2000 -- arguments per variadic call, well under Lua's unpack limit

-- The layout fence: 'layout' in a partition's meta is written by zsched migrate-partitions: '-'
-- while it moves jobs between partitions, then the new partition count. A caller whose count
-- differs (it would compute other partitions for ids, keys and crons) is refused before any
-- write, with an error it can act on: re-read the count from {ns}:cfg and plan again (clients
-- do that themselves), or wait for the migration to finish. Never-migrated namespaces have no
-- 'layout' field, so the fence costs one HGET.
local function layout_fence(k_meta, layout)
  if layout == '' then return nil end
  local l = redis.call('HGET', k_meta, 'layout')
  if l and l ~= layout then
    if l == '-' then
      return redis.error_reply('ZSCHED_LAYOUT migrating: zsched migrate-partitions is moving this namespace to a ' ..
        'new partition count; calls are refused until it finishes (see docs/scaling.md)')
    end
    return redis.error_reply('ZSCHED_LAYOUT changed: the namespace now has ' .. l .. ' partitions, this ' ..
      'process uses ' .. layout .. ' (zsched migrate-partitions ran); restart it so it reads the new count')
  end
  return nil
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A whole number as the decimal string Redis expects: tostring() would switch to exponent
-- notation past 14 digits. Hot paths also pass numbers to redis.call (and build field names)
-- through this: a Lua number argument is formatted with %.17g and a number concatenated into a
-- string with %.14g, both glibc's floating-point printf (callgrind: a one-job tick went from
-- 324 k to 315 k instructions; the float formatting left is Redis's own, of scores in replies).
local function fmt(n) return string.format('%d', n) end
local function u16(s, i) local a, b = string.byte(s, i, i + 1); return a * 256 + b end
local function u32(s, i)
  local a, b, c, d = string.byte(s, i, i + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end
-- One string.byte or string.char and plain arithmetic each: a C call costs Redis's Lua about 0.5 k
-- instructions (callgrind), so math.floor is written (n - n % 256) / 256 (exact for integers).
local function u48(s, i)
  local a, b, c, d, e, f = string.byte(s, i, i + 5)
  return ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
end
local function p16(n) local b = n % 256; return string.char((n - b) / 256, b) end
local function p32(n)
  local d = n % 256; n = (n - d) / 256
  local c = n % 256; n = (n - c) / 256
  local b = n % 256
  return string.char((n - b) / 256 % 256, b, c, d)
end
local function p48(n)
  local f = n % 256; n = (n - f) / 256
  local e = n % 256; n = (n - e) / 256
  local d = n % 256; n = (n - d) / 256
  local c = n % 256; n = (n - c) / 256
  local b = n % 256
  return string.char((n - b) / 256, b, c, d, e, f)
end
local function flag(flags, bitv) return flags % (2 * bitv) >= bitv end
-- Record accessors; layout in scheduler/protocol/codec.py (1-based offsets here).
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
local function jget(k_j, id)
  local v = redis.call('HGET', k_j, id)
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

local qname_cache = {} -- index -> name, for this call (one partition): see the header
local function queue_name(k_q, idx)
  local name = qname_cache[idx]
  if name == nil then
    name = redis.call('HGET', k_q, 'i:' .. fmt(idx))
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
local function queue_index(prefix, k_q, name)
  local idx = redis.call('HGET', k_q, 'n:' .. name)
  if idx then return tonumber(idx) end
  idx = tonumber(redis.call('HGET', k_q, 'next') or '0') + 1
  if idx > 65535 then -- decided before any write: a script that errors must not have written
    local t = redis.call('TIME')
    local cooled = redis.call('ZRANGE', prefix .. 'qfree', '-inf', t[1] .. '000', 'BYSCORE', 'LIMIT', 0, 1)
    if #cooled == 0 then
      error('zsched: 65535 queue names are in use in this partition and none is retired yet; queues are ' ..
            'retired after being empty and idle for the queue retirement time (Client.set_queue_retirement)')
    end
    redis.call('ZREM', prefix .. 'qfree', cooled[1])
    idx = tonumber(cooled[1])
  else
    redis.call('HSET', k_q, 'next', fmt(idx))
  end
  redis.call('HSET', k_q, 'n:' .. name, idx, 'i:' .. idx, name)
  return idx
end
local function touch_queue(k_q, idx, now) redis.call('HSET', k_q, 'u:' .. fmt(idx), fmt(now)) end

-- Counter and gauge increments are summed in Lua and written once per field per call (the
-- per-call accumulator 'bumps': see the header).
local bumps = {}
local function bump(key, field, n)
  local h = bumps[key]
  if not h then h = {}; bumps[key] = h end
  h[field] = (h[field] or 0) + (n or 1)
end
-- The last hour per minute, which the console charts (scheduler/protocol/history.py reads it):
-- the counters 'fired:Q', 'acked:Q', 'failed:Q' and 'dead:Q' of minute M (Redis ms // 60000) also
-- go to the hash PREFIX .. 'hist:' .. M, in the partition's slot (Redis Cluster). The hash expires
-- HISTORY_TTL_S after the last field it gained (its TTL is set only when a HINCRBY creates a
-- field, at most 4 per queue and minute), so a partition holds about 62 of them whatever the
-- rate: bounded memory with no trimming pass. A call's counts are summed here (one 'now' per call:
-- one hash) and written by flush_bumps: one HINCRBY per field, as for the counters.
-- tick's fast path writes its 'fired' count itself (it runs before the library), with the same TTL.
local HISTORY_TTL_S = 3720
local minute_counts, minute_key = {}, nil
-- Count 'field' (KIND:QUEUE) n times (default 1) in the counters hash k_c (K_C) and in the history
-- of minute 'now' (ms) of the partition with key prefix 'prefix' (PREFIX).
local function tally(k_c, prefix, field, n, now)
  bump(k_c, field, n)
  minute_key = prefix .. 'hist:' .. fmt((now - now % 60000) / 60000)
  minute_counts[field] = (minute_counts[field] or 0) + (n or 1)
end
local function flush_bumps()
  for key, h in pairs(bumps) do
    for field, n in pairs(h) do
      if n ~= 0 then redis.call('HINCRBY', key, field, fmt(n)) end
    end
  end
  if minute_key then
    for field, n in pairs(minute_counts) do
      if redis.call('HINCRBY', minute_key, field, fmt(n)) == n then redis.call('EXPIRE', minute_key, HISTORY_TTL_S) end
    end
  end
end

-- Variadic command in chunks: cmd(key, prefix_args..., items...).
local function multi(cmd, key, items)
  for s = 1, #items, CHUNK do
    redis.call(cmd, key, unpack(items, s, math.min(s + CHUNK - 1, #items)))
  end
end

local function head_score(k_t)
  local h = redis.call('ZRANGE', k_t, '0', '0', 'WITHSCORES')
  if h[2] then return tonumber(h[2]) end
  return nil
end

-- Find a scheduled job in the timer set without a per-job index: its score is the id's run_at
-- unless the job moved (then 'm' has it); among equal scores members sort by id bytes, so a
-- binary search by rank finds it in O(log n).
local function find_timer(k_t, k_m, id)
  if string.len(id) ~= ID_LEN then return nil end
  local s = redis.call('HGET', k_m, id)
  if s then s = tonumber(s) else s = u48(id, 1) end
  local ss = fmt(s)
  local n = redis.call('ZCOUNT', k_t, ss, ss)
  if n == 0 then return nil end
  local lo = redis.call('ZCOUNT', k_t, '-inf', '(' .. ss)
  local hi = lo + n - 1
  if n <= 8 then
    for _, m in ipairs(redis.call('ZRANGE', k_t, lo, hi)) do
      if string.sub(m, 1, ID_LEN) == id then return m, s end
    end
    return nil
  end
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', k_t, mid, mid)[1]
    local mid_id = string.sub(m, 1, ID_LEN)
    if mid_id == id then return m, s end
    if id_less(mid_id, id) then lo = mid + 1 else hi = mid - 1 end
  end
  return nil
end

-- Does a job with this id exist in any state, or as a tombstone? (re-sent schedule calls)
-- Ambient: looks in every state (K_J, K_F, K_X, the timers K_T and K_M), as place and cancel_job.
local function job_exists(id)
  if redis.call('HEXISTS', K_J, id) == 1 or redis.call('HEXISTS', K_F, id) == 1 or find_timer(K_T, K_M, id) then
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
local function unlink_waiting(prefix, k_g, id, q)
  if redis.call('ZREM', prefix .. 'h:' .. q, id) == 1 then
    bump(k_g, 's:' .. q, -1)
    bump(k_g, 'h:' .. q, -1)
    return true
  end
  return redis.call('LREM', prefix .. 'r:' .. q, 1, id) == 1
end

local function remove_timer(k_t, k_m, id, member)
  redis.call('ZREM', k_t, member)
  redis.call('HDEL', k_m, id)
end

-- Add to the timer set; remember the score in 'm' when it differs from the id's own run_at.
local function put_timer(k_t, k_m, id, rec, at)
  redis.call('ZADD', k_t, at, id .. rec)
  if at ~= u48(id, 1) then redis.call('HSET', k_m, id, fmt(at)) else redis.call('HDEL', k_m, id) end
end

-- Sharded pub/sub when the channel prefix 'chan' (CHAN) starts with '{' (byte 123; a namespace
-- name never does): SPUBLISH reaches only the node that owns the partition's slot, where PUBLISH
-- would be broadcast over the whole cluster bus. One byte comparison per publish, no extra
-- argument. Publishes 'msg' on chan .. name.
local function publish(chan, name, msg)
  redis.call(string.byte(chan, 1) == 123 and 'SPUBLISH' or 'PUBLISH', chan .. name, msg)
end
-- Doorbells: how workers learn of ready jobs (docs/architecture.md "Waking workers"). A queue's
-- bell is the sorted set "{NS}:bell:QUEUE" (keys.py Keyspace.bell): member "P" (partition P's
-- ready list has jobs) or "P:resume" (resume.lua), score the ring's time in ms. A worker with free
-- handler slots and nothing else to claim blocks in BZPOPMIN on its queues' bells; Redis hands
-- each member to ONE blocked worker (the longest waiting), so a ring wakes one worker whatever the
-- number that serve the queue, where a pub/sub message woke them all. NX: ringing a bell that
-- already holds the member keeps it once, at its first ring's time (oldest first when workers
-- free up), so a bell holds at most two members per partition. Off a cluster the scripts ring
-- the bell themselves (a key outside the partition's slot, as the ready lists are outside the
-- declared keys); on Redis Cluster the bell is in another slot, so they SPUBLISH
-- "r MEMBER QUEUE" on the partition's wake channel instead, and the partition's owner rings it
-- (scheduler/tier/process.py); tick reports its queues in its reply and the owner rings those.
-- A queue paused in this partition (pause.lua) is not rung: its workers would take the ring only to
-- find the queue paused. ring() looks for the pause in the partition of 'prefix' (PREFIX); resume.lua
-- rings "P:resume" with prefix false (that ring always goes out).
-- claim's due-job limit: of the jobs it popped (ids, and their 'j' values recs; RPOP took them
-- from the tail of 'list'), the first due one (due_ms <= now) past the first max_due and every job
-- after it go back to the list, in their order (pushed back last-first, so the first is the tail
-- again), and leave ids and recs. True when some went back.
local function keep_due_over(list, ids, recs, max_due, now)
  local due_n = 0
  for i = 1, #ids do
    local v = recs[i]
    if v and u48(v, 1) <= now then
      due_n = due_n + 1
      if due_n > max_due then
        local back = {}
        for j = #ids, i, -1 do back[#back + 1] = ids[j]; ids[j] = nil; recs[j] = nil end
        redis.call('RPUSH', list, unpack(back))
        return true
      end
    end
  end
  return false
end
local function paused_here(prefix, qname) return redis.call('HEXISTS', prefix .. 'paused', qname) == 1 end
-- Burst bells: a script that leaves BURST_RING or more jobs ready in a partition's list at once
-- (a tick firing a batch, a claim leaving a batch behind), and resume, ring the queue's burst bell
-- "{NS}:bell:QUEUE:b" (keys.py Keyspace.burst_bell) instead, with the same member. Every idle
-- worker waits on both; with one listener (workers/doorbell.py, the default) only the listener
-- waits on the bell, every idle worker on the burst bell, so spread traffic stays on one warm
-- worker and a burst reaches all idle workers at once. On a cluster the relay message is
-- "b MEMBER QUEUE" for a burst, and tick flags its queues in its reply.
local BURST_RING = 4
local BURST_RANK = '3' -- BURST_RING - 1 as text: redis.call formats a Lua number with %.17g (2 k instructions)
-- A tick's jobs of one queue make a burst when BURST_RING of them come due within BURST_SPAN_MS
-- (scheduler/protocol/bells.py BURST_SPAN_MS): 'times' are their due times in the order the tick
-- fired them, those already due counted as due now, which makes them nondecreasing (held jobs
-- first, all due; then the timers by score). Spread traffic handed off with a widened lead
-- (scheduler/tier/coalesce.py) fires several jobs per tick, due tens of ms apart: the warm
-- listener takes them one after another, where a burst ring (on the count alone) woke idle
-- workers for them, cold processes (16 workers at 300 jobs/s: 1.24x the CPU per job).
local BURST_SPAN_MS = 10
local function bursty(times)
  for i = BURST_RING, #times do
    if times[i] - times[i - BURST_RING + 1] <= BURST_SPAN_MS then return true end
  end
  return false
end
-- The due time (ms) of the BURST_RING-th earliest timer in the timer set 'k_t', or -1 when it holds
-- fewer: tick reports it beside the earliest one, so the owner sees a burst coming (BURST_RING due
-- together) and hands it off with its wider burst lead (scheduler/tier/coalesce.py HandoffLead).
-- O(log n), one member read.
local function burst_score(k_t)
  local h = redis.call('ZRANGE', k_t, BURST_RANK, BURST_RANK, 'WITHSCORES')
  if h[2] then return tonumber(h[2]) end
  return -1
end
-- Ring 'bell' (a queue's bell key; its burst bell is bell .. ':b') with 'member' at 'at' (ms, a
-- decimal string). A member is in one of the two at most, so no worker claims twice for one ring:
-- a burst ring moves it from the bell to the burst bell, and a bell ring of a member already in
-- the burst bell (which every idle worker hears) changes nothing. Also the fast paths' ring.
local function bell_ring(bell, member, at, burst)
  if burst then
    redis.call('ZADD', bell .. ':b', 'NX', at, member)
    redis.call('ZREM', bell, member)
  elseif not redis.call('ZSCORE', bell .. ':b', member) then
    redis.call('ZADD', bell, 'NX', at, member)
  end
end
local function ring(chan, prefix, qname, member, now, n)
  if prefix and paused_here(prefix, qname) then return end
  local burst = n and n >= BURST_RING
  if string.byte(chan, 1) == 123 then
    redis.call('SPUBLISH', chan .. 'wake', (burst and 'b ' or 'r ') .. member .. ' ' .. qname)
  else
    bell_ring('{' .. string.sub(chan, 1, -2) .. '}:bell:' .. qname, member, fmt(now), burst)
  end
end
-- The queues whose ready lists got jobs in this call (a per-call accumulator: see the header),
-- rung once each at the end by publish_ready.
local ready_touched = {}
local function push_ready(prefix, id, qname, front)
  if front then
    redis.call('RPUSH', prefix .. 'r:' .. qname, id) -- the tail is popped next
  else
    redis.call('LPUSH', prefix .. 'r:' .. qname, id)
  end
  ready_touched[qname] = (ready_touched[qname] or 0) + 1
end
local function publish_ready(chan, prefix, part, now)
  if next(ready_touched) == nil then return end
  now = now or now_ms()
  for qname, n in pairs(ready_touched) do ring(chan, prefix, qname, part, now, n) end
end
-- Put a job back to work at 'at': its ready list when due (body in 'j', due = at), else the timer
-- set (body inside the timer member). Returns 'at' when it went to the timer set, so the caller
-- can wake the partition's owner if it lands before the earliest timer; nil otherwise.
-- Ambient: it puts the job in whichever state its time says (K_J and PREFIX's ready list, or K_T
-- and K_M), with its gauge (K_G): a parameter for each would restate the partition at every call.
local function place(id, rec, q, at, now)
  if at <= now then
    redis.call('HSET', K_J, id, jval(rec, at))
    push_ready(PREFIX, id, q, false)
    return nil
  end
  redis.call('HDEL', K_J, id)
  put_timer(K_T, K_M, id, rec, at)
  bump(K_G, 's:' .. q)
  return at
end
-- Wake the partition's owner: partition number 'part' (PART) on chan .. 'wake'.
local function wake_scheduler(chan, part) publish(chan, 'wake', part) end
-- The end of a script that placed jobs: write the summed counters, tell the workers about ready
-- jobs, and wake the owner when a timer landed before the partition's earliest one ('head', read
-- before the writes). chan, prefix, part: CHAN, PREFIX, PART.
local function settle(chan, prefix, part, earliest, head, now)
  flush_bumps()
  publish_ready(chan, prefix, part, now)
  if earliest and (head == nil or earliest < head) then wake_scheduler(chan, part) end
end
-- The worker registry's keys (registry_beat, registry_leave, registry_read): exactly KEYS[1]
-- "{NS}:workers" and KEYS[2] "{NS}:workers:live" of one namespace NS (keys.py); records the call's
-- refusal (arg) otherwise, so a direct caller cannot make the registry scripts write elsewhere.
-- Returns the two keys (the records hash, the liveness set), which the scripts use from here on.
-- Ambient: KEYS, as it is the check of the call's keys (COMMON is for the partition scripts).
local function registry_keys()
  local ns = string.match(KEYS[1] or '', '^{([A-Za-z0-9][A-Za-z0-9_.%-]*)}:workers$')
  if #KEYS ~= 2 or not ns or #ns > NAME_MAX or KEYS[2] ~= KEYS[1] .. ':live' then
    arg('refuse', 'KEYS', 'registry keys', '2 keys, "{NAMESPACE}:workers" and "{NAMESPACE}:workers:live"',
      table.concat(KEYS, ' '))
  end
  return KEYS[1], KEYS[2]
end
-- The worker registry (scheduler/protocol/registry.py; registry_beat, registry_read): k_records the
-- hash "{ns}:workers", k_live the liveness set "{ns}:workers:live" (id -> ms until which the record
-- counts as live): registry_keys's two keys. Deletes up to `limit` records whose time is up (score
-- <= now), longest dead first, from both keys at once; returns how many. O(log N + limit).
local function registry_prune(k_records, k_live, now, limit)
  if limit <= 0 then return 0 end
  local dead = redis.call('ZRANGEBYSCORE', k_live, '-inf', now, 'LIMIT', 0, limit)
  if #dead > 0 then
    redis.call('HDEL', k_records, unpack(dead))
    redis.call('ZREM', k_live, unpack(dead))
  end
  return #dead
end
